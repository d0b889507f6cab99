package flow

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/agext/levenshtein"
	"github.com/hashicorp/hcl/v2"
)

// The helpers below word and order diagnostics the same way wherever they are made: in this
// package, in the test-file language (package flow/testfile), in the checks of kinds declared
// outside this package, and on the command line.

// SortDiagnostics orders diagnostics by file and position, those without a location first, so that
// a user reads them top-down.
func SortDiagnostics(diags hcl.Diagnostics) hcl.Diagnostics {
	sort.SliceStable(diags, func(i, j int) bool {
		a, b := diags[i].Subject, diags[j].Subject
		switch {
		case a == nil || b == nil:
			return a == nil && b != nil
		case a.Filename != b.Filename:
			return a.Filename < b.Filename
		}
		return a.Start.Byte < b.Start.Byte
	})
	return diags
}

// Suggest returns the candidate closest to a misspelt name, or "" when none is close enough to be
// what the user meant. It uses the same distance as hcl's own suggestions, so that all of
// flowrun's "did you mean" hints agree; the command line uses it for names it checks itself, such
// as a topic given as an argument.
func Suggest(given string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if d := levenshtein.Distance(given, c, nil); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// DidYouMean formats a suggestion (Suggest) as the end of a diagnostic's detail, or returns "".
func DidYouMean(given string, candidates []string) string {
	if s := Suggest(given, candidates); s != "" {
		return " Did you mean \"" + s + "\"?"
	}
	return ""
}

// QuotedList lists names quoted and separated by commas: "a", "b", "c".
func QuotedList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// JoinOr lists words as alternatives: a, b or c.
func JoinOr(words []string) string {
	switch len(words) {
	case 0:
		return ""
	case 1:
		return words[0]
	}
	out := ""
	for i, w := range words {
		switch {
		case i == 0:
			out = w
		case i == len(words)-1:
			out += " or " + w
		default:
			out += ", " + w
		}
	}
	return out
}

// DescribeFSError words an error of reading a file or directory for a diagnostic's detail.
func DescribeFSError(err error) string {
	switch {
	case os.IsNotExist(err):
		return "no such file or directory"
	case os.IsPermission(err):
		return "permission denied"
	}
	return err.Error()
}

// JSONDiagnostic is the machine-readable form of a diagnostic, printed by validate --json. Its shape
// follows Terraform's JSON diagnostics, which editor integrations already understand.
type JSONDiagnostic struct {
	Severity string       `json:"severity"` // "error" or "warning"
	Summary  string       `json:"summary"`
	Detail   string       `json:"detail,omitempty"`
	Range    *JSONRange   `json:"range,omitempty"`
	Snippet  *JSONSnippet `json:"snippet,omitempty"`
}

// JSONRange is a source range; lines and columns count from 1, bytes from 0.
type JSONRange struct {
	Filename string  `json:"filename"`
	Start    JSONPos `json:"start"`
	End      JSONPos `json:"end"`
}

// JSONPos is a position in a source file.
type JSONPos struct {
	Line   int `json:"line"`
	Column int `json:"column"`
	Byte   int `json:"byte"`
}

// JSONSnippet is the source code around a diagnostic.
type JSONSnippet struct {
	Code      string `json:"code"`       // the whole lines the range covers
	StartLine int    `json:"start_line"` // the line number of the first line of Code
	// HighlightStartOffset and HighlightEndOffset delimit the range within Code, in bytes.
	HighlightStartOffset int `json:"highlight_start_offset"`
	HighlightEndOffset   int `json:"highlight_end_offset"`
}

// DiagnosticsJSON converts diagnostics to their JSON form, with snippets from files.
func DiagnosticsJSON(diags hcl.Diagnostics, files map[string]*hcl.File) []JSONDiagnostic {
	out := make([]JSONDiagnostic, 0, len(diags))
	for _, d := range diags {
		jd := JSONDiagnostic{Severity: "error", Summary: d.Summary, Detail: d.Detail}
		if d.Severity == hcl.DiagWarning {
			jd.Severity = "warning"
		}
		if d.Subject != nil {
			r := *d.Subject
			jd.Range = &JSONRange{
				Filename: r.Filename,
				Start:    JSONPos{Line: r.Start.Line, Column: r.Start.Column, Byte: r.Start.Byte},
				End:      JSONPos{Line: r.End.Line, Column: r.End.Column, Byte: r.End.Byte},
			}
			if f := files[r.Filename]; f != nil {
				jd.Snippet = snippet(f.Bytes, r)
			}
		}
		out = append(out, jd)
	}
	return out
}

// snippet cuts the whole lines that a range covers out of a file.
func snippet(src []byte, r hcl.Range) *JSONSnippet {
	if r.Start.Byte < 0 || r.End.Byte > len(src) || r.Start.Byte > r.End.Byte {
		return nil
	}
	start := bytes.LastIndexByte(src[:r.Start.Byte], '\n') + 1
	end := len(src)
	if i := bytes.IndexByte(src[r.End.Byte:], '\n'); i >= 0 {
		end = r.End.Byte + i
	}
	return &JSONSnippet{
		Code:                 string(src[start:end]),
		StartLine:            r.Start.Line,
		HighlightStartOffset: r.Start.Byte - start,
		HighlightEndOffset:   r.End.Byte - start,
	}
}
