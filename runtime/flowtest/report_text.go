package flowtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
)

// WriteText writes one run's result for people: a PASS or FAIL line, then each failure as a
// diagnostic with its source snippet (the printer `flowrun validate` uses for pipeline errors),
// then the error that stopped the run. With verbose, every message that arrived at each sink and
// topic follows. What follows the first line is indented under it, so runs stay apart.
//
// Diagnostics are printed without word wrapping (width 0): hcl wraps a Detail to the width, which
// would break the one-message-a-line diff. They are not colored, as the signature has no terminal
// to ask.
//
// The text is written to w at once, and the error is w's.
func WriteText(w io.Writer, r *RunResult, files map[string]*hcl.File, verbose bool) error {
	status := "PASS"
	if !r.Passed() {
		status = "FAIL"
	}
	var text strings.Builder
	fmt.Fprintf(&text, "%s  %s: run %q (%s, %s virtual)\n", status, r.File, r.Run, formatWall(r.Wall), r.Virtual)

	var body bytes.Buffer
	dw := hcl.NewDiagnosticTextWriter(&body, files, 0, false)
	for i := range r.Failures {
		_ = dw.WriteDiagnostic(failureDiagnostic(&r.Failures[i])) // a bytes.Buffer does not fail
	}
	if r.Err != nil {
		fmt.Fprintf(&body, "Error: the run did not complete: %v\n\n", r.Err)
	}
	for _, path := range r.Updated {
		fmt.Fprintf(&body, "updated %s with what arrived\n", path)
	}
	if verbose {
		writeSeen(&body, r.Seen)
		writeDeadLetters(&body, r.DeadLetters)
	}
	writeIndented(&text, body.String(), "    ")
	_, err := io.WriteString(w, text.String())
	return err
}

// failureDiagnostic turns a failure into the diagnostic the text printer shows: the failed block as
// the subject, the summary, and the diff and the why lines as the detail.
func failureDiagnostic(f *Failure) *hcl.Diagnostic {
	d := &hcl.Diagnostic{Severity: hcl.DiagError, Summary: f.Summary, Detail: failureDetail(f)}
	if f.Range.Filename != "" {
		rng := f.Range
		d.Subject = &rng
	}
	return d
}

// failureDetail is a failure's diff, then its why lines under a heading.
func failureDetail(f *Failure) string {
	var parts []string
	if f.Diff != "" {
		parts = append(parts, f.Diff)
	}
	if len(f.Why) > 0 {
		parts = append(parts, "What happened:\n  "+strings.Join(f.Why, "\n  "))
	}
	return strings.Join(parts, "\n\n")
}

// writeSeen lists every message that arrived, by sink and topic name.
func writeSeen(w *bytes.Buffer, seen map[string][]Arrived) {
	for _, where := range sortedWheres(seen) {
		msgs := seen[where]
		if len(msgs) == 0 {
			fmt.Fprintf(w, "%s: nothing arrived\n", where)
			continue
		}
		fmt.Fprintf(w, "%s (%d):\n", where, len(msgs))
		for _, m := range msgs {
			key := ""
			if m.Key != "" {
				key = "key=" + keyText(m.Key) + " "
			}
			fmt.Fprintf(w, "  %s%s\n", key, compactPayload(m.Payload))
		}
	}
}

// writeDeadLetters lists every dead letter of the run.
func writeDeadLetters(w *bytes.Buffer, dls []DeadLetter) {
	if len(dls) == 0 {
		fmt.Fprintln(w, "dead letters: none")
		return
	}
	fmt.Fprintf(w, "dead letters (%d):\n", len(dls))
	for _, dl := range dls {
		fmt.Fprintf(w, "  %s after %d attempt(s): %s: %s\n", dl.Node, dl.Attempts, dl.Reason, compactPayload(dl.Payload))
	}
}

// compactPayload shows a payload as it arrived, on one line.
func compactPayload(p []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, p) == nil {
		return buf.String()
	}
	return strings.ReplaceAll(string(p), "\n", `\n`)
}

// writeIndented writes text with prefix before each non-empty line.
func writeIndented(sb *strings.Builder, text, prefix string) {
	text = strings.TrimRight(text, "\n")
	if text == "" {
		return
	}
	for _, line := range strings.Split(text, "\n") {
		if line != "" {
			sb.WriteString(prefix)
			sb.WriteString(line)
		}
		sb.WriteByte('\n')
	}
}

// formatWall rounds a real duration to what a person reads: 12ms, 1.234s, 250µs.
func formatWall(d time.Duration) string {
	if d >= time.Millisecond {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// WriteTextSummary writes the last line of `flowrun test`: how many runs passed and failed, in how
// many files and how long (the sum of the runs' wall time), and with failures, the seed to replay
// them with. The error is w's.
func WriteTextSummary(w io.Writer, results []*RunResult, seed int64) error {
	passed, failed := 0, 0
	files := map[string]bool{}
	var wall time.Duration
	for _, r := range results {
		if r.Passed() {
			passed++
		} else {
			failed++
		}
		files[r.File] = true
		wall += r.Wall
	}
	var text strings.Builder
	fmt.Fprintf(&text, "%d passed, %d failed (%d %s, %s)\n", passed, failed, len(files), plural(len(files), "file", "files"), formatTotal(wall))
	if failed > 0 {
		fmt.Fprintf(&text, "seed %d: replay with -seed %d\n", seed, seed)
	}
	_, err := io.WriteString(w, text.String())
	return err
}

// formatTotal writes a total time in tenths of a second, or in milliseconds under a tenth.
func formatTotal(d time.Duration) string {
	if d < 100*time.Millisecond {
		return d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
