// Package fixturetest compares what the front ends of flowrun's two languages (packages flow and
// flow/testfile) produce with what fixture files expect: the diagnostics that a fixture marks in
// its own comments, and golden files. Only their tests use it; it knows neither language.
//
// A fixture marks an expected diagnostic on the line where it must be located, with a comment
// "# ERROR: text" or "# WARNING: text" (in JSON syntax, a "//" key with the same text), where text
// must appear in the diagnostic's summary and detail joined by ": ".
package fixturetest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
)

var expectation = regexp.MustCompile(`(?:#|"//":\s*")\s*(ERROR|WARNING):\s*(.*?)"?\s*$`)

// An Expectation is a diagnostic that a fixture expects on one of its lines.
type Expectation struct {
	File     string
	Line     int
	Severity hcl.DiagnosticSeverity
	Text     string
	Met      bool // a diagnostic matched it (Match)
}

// ReadExpectations collects the expectations of a fixture file, or of every file of a directory.
func ReadExpectations(t testing.TB, path string) []*Expectation {
	t.Helper()
	files := []string{path}
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		files, _ = filepath.Glob(filepath.Join(path, "*"))
	}
	var out []*Expectation
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			m := expectation.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			sev := hcl.DiagError
			if m[1] == "WARNING" {
				sev = hcl.DiagWarning
			}
			out = append(out, &Expectation{File: f, Line: i + 1, Severity: sev, Text: strings.ReplaceAll(m[2], `\"`, `"`)})
		}
	}
	return out
}

// Match reports whether an expectation expects the located diagnostic d, and marks it met.
func Match(d *hcl.Diagnostic, xs []*Expectation) bool {
	full := d.Summary + ": " + d.Detail
	for _, x := range xs {
		if x.File == d.Subject.Filename && x.Line == d.Subject.Start.Line && x.Severity == d.Severity && strings.Contains(full, x.Text) {
			x.Met = true
			return true
		}
	}
	return false
}

// ReportUnmet fails the test for each expectation that no diagnostic of diags met.
func ReportUnmet(t testing.TB, xs []*Expectation, diags hcl.Diagnostics) {
	t.Helper()
	for _, x := range xs {
		if !x.Met {
			t.Errorf("%s:%d: expected %s containing %q; got:\n%s", x.File, x.Line, severityName(x.Severity), x.Text, List(diags))
		}
	}
}

// CheckSnippet renders the diagnostic as flowrun validate does and checks that the source line is
// shown under its file name and line number.
func CheckSnippet(t testing.TB, d *hcl.Diagnostic, files map[string]*hcl.File) {
	t.Helper()
	var buf bytes.Buffer
	if err := hcl.NewDiagnosticTextWriter(&buf, files, 0, false).WriteDiagnostic(d); err != nil {
		t.Fatal(err)
	}
	f := files[d.Subject.Filename]
	if f == nil {
		t.Errorf("no source for %s", d.Subject.Filename)
		return
	}
	lines := strings.Split(string(f.Bytes), "\n")
	want := fmt.Sprintf("%d: %s", d.Subject.Start.Line, lines[d.Subject.Start.Line-1])
	if !strings.Contains(buf.String(), fmt.Sprintf("on %s line %d", d.Subject.Filename, d.Subject.Start.Line)) ||
		!strings.Contains(buf.String(), strings.TrimRight(want, " ")) {
		t.Errorf("rendered diagnostic lacks its snippet %q:\n%s", want, buf.String())
	}
}

// List lists diagnostics one a line, sorted, for a test's failure message.
func List(diags hcl.Diagnostics) string {
	var lines []string
	for _, d := range diags {
		lines = append(lines, fmt.Sprintf("  %s %s: %s: %s", severityName(d.Severity), d.Subject, d.Summary, d.Detail))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func severityName(s hcl.DiagnosticSeverity) string {
	if s == hcl.DiagWarning {
		return "a warning"
	}
	return "an error"
}

// Golden compares got with a golden file, or rewrites the file when update is set (the test
// package's -update flag, which make generate sets).
func Golden(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run make generate to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: run make generate and review the difference\n--- got ---\n%s", path, got)
	}
}
