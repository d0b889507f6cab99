//go:build !go1.27

package expr

import "github.com/apparentlymart/go-textseg/v15/textseg"

// graphemeCount counts grapheme clusters with the Unicode tables cty uses
// on this Go version, so length() agrees with cty's strlen.
func graphemeCount(s string) int {
	n, _ := textseg.TokenCount([]byte(s), textseg.ScanGraphemeClusters)
	return n
}
