package cmd

import (
	"io"
	"os"

	"github.com/hashicorp/hcl/v2"
	"golang.org/x/term"
)

// printDiagnostics writes diagnostics with their source snippets, in color on a terminal.
func printDiagnostics(w io.Writer, diags hcl.Diagnostics, files map[string]*hcl.File) {
	if len(diags) == 0 {
		return
	}
	width, color := uint(0), false
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		color = os.Getenv("NO_COLOR") == ""
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 20 {
			width = uint(cols)
		}
	}
	wr := hcl.NewDiagnosticTextWriter(w, files, width, color)
	_ = wr.WriteDiagnostics(diags) // a failed write to stderr has nowhere better to go
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// countDiagnostics counts errors and warnings.
func countDiagnostics(diags hcl.Diagnostics) (errs, warnings int) {
	for _, d := range diags {
		if d.Severity == hcl.DiagError {
			errs++
		} else {
			warnings++
		}
	}
	return errs, warnings
}
