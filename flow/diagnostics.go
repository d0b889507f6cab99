package flow

import (
	"bytes"

	"github.com/hashicorp/hcl/v2"
)

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
