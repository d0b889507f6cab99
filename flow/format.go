package flow

import (
	"bytes"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
)

// Format returns the canonical layout of a native-syntax pipeline file: hclwrite's spacing,
// indentation and alignment of equals signs. A file with syntax errors is returned unchanged with
// the errors, since formatting it could move the mistake away from what the user wrote.
func Format(filename string, src []byte) ([]byte, hcl.Diagnostics) {
	if _, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos); diags.HasErrors() {
		return src, diags
	}
	return hclwrite.Format(src), nil
}

// Formattable reports whether flowrun fmt formats a file: native syntax only, as JSON files have
// their own tools.
func Formattable(filename string) bool {
	return strings.HasSuffix(filename, nativeExt)
}

// FormatFiles lists the files of the pipeline at path that fmt would format: its own and its test
// files (FindTestFiles). A test file's path gives that file.
func FormatFiles(path string) ([]string, hcl.Diagnostics) {
	var files []string
	var diags hcl.Diagnostics
	if IsTestFile(path) {
		files = []string{path}
	} else if files, diags = pipelineFiles(path); !diags.HasErrors() {
		tests, moreDiags := FindTestFiles(path)
		files, diags = append(files, tests...), append(diags, moreDiags...)
	}
	var out []string
	for _, f := range files {
		if Formattable(f) {
			out = append(out, f)
		}
	}
	return out, diags
}

// IsFormatted reports whether src is already in canonical layout.
func IsFormatted(filename string, src []byte) (bool, hcl.Diagnostics) {
	out, diags := Format(filename, src)
	return bytes.Equal(out, src), diags
}
