package flow_test

import (
	"bytes"
	"fmt"
	. "github.com/flowrun/flowrun/flow"
	_ "github.com/flowrun/flowrun/stages"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
)

// Each file (or directory) in testdata/diagnostics is a pipeline with one kind of mistake. A comment
// on a line says what is expected there: "# ERROR: text" or "# WARNING: text", where text must appear
// in the diagnostic's summary and detail (joined by ": "). JSON files use a "//" key with the same
// text. Every diagnostic must be expected, every expectation met, and every diagnostic located.

var expectation = regexp.MustCompile(`(?:#|"//":\s*")\s*(ERROR|WARNING):\s*(.*?)"?\s*$`)

// testOptions are the compile options of the fixture tests: a binary with two Go stage functions and
// an empty environment.
var testOptions = Options{
	GoFuncs:   []string{"acme.enrich", "acme.score"},
	LookupEnv: func(string) (string, bool) { return "", false },
}

type expected struct {
	file     string
	line     int
	severity hcl.DiagnosticSeverity
	text     string
	met      bool
}

func TestDiagnosticFixtures(t *testing.T) {
	entries, err := os.ReadDir("testdata/diagnostics")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		path := filepath.Join("testdata/diagnostics", e.Name())
		t.Run(e.Name(), func(t *testing.T) {
			t.Parallel()
			expectations := readExpectations(t, path)
			if len(expectations) == 0 {
				t.Fatalf("%s expects no diagnostic; every fixture must expect at least one", path)
			}
			_, cfg, diags := Build(path, testOptions)
			for _, d := range diags {
				if d.Subject == nil {
					t.Errorf("diagnostic without a location: %s: %s", d.Summary, d.Detail)
					continue
				}
				if d.Subject.Start.Line < 1 || d.Subject.Start.Column < 1 {
					t.Errorf("diagnostic at an invalid position %s: %s", d.Subject, d.Summary)
				}
				if !matchExpectation(d, expectations) {
					t.Errorf("unexpected diagnostic at %s: %s: %s", d.Subject, d.Summary, d.Detail)
				}
				checkSnippet(t, d, cfg.Files())
			}
			for _, x := range expectations {
				if !x.met {
					t.Errorf("%s:%d: expected %s containing %q; got:\n%s", x.file, x.line, severityName(x.severity), x.text, listDiagnostics(diags))
				}
			}
		})
	}
}

// readExpectations collects the expectations of a fixture file or directory.
func readExpectations(t *testing.T, path string) []*expected {
	files := []string{path}
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		files, _ = filepath.Glob(filepath.Join(path, "*"))
	}
	var out []*expected
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
			out = append(out, &expected{file: f, line: i + 1, severity: sev, text: strings.ReplaceAll(m[2], `\"`, `"`)})
		}
	}
	return out
}

func matchExpectation(d *hcl.Diagnostic, xs []*expected) bool {
	full := d.Summary + ": " + d.Detail
	for _, x := range xs {
		if x.file == d.Subject.Filename && x.line == d.Subject.Start.Line && x.severity == d.Severity && strings.Contains(full, x.text) {
			x.met = true
			return true
		}
	}
	return false
}

// checkSnippet renders the diagnostic as flowrun validate does and checks that the source line is
// shown under its file name and line number.
func checkSnippet(t *testing.T, d *hcl.Diagnostic, files map[string]*hcl.File) {
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

func severityName(s hcl.DiagnosticSeverity) string {
	if s == hcl.DiagWarning {
		return "a warning"
	}
	return "an error"
}

func listDiagnostics(diags hcl.Diagnostics) string {
	var lines []string
	for _, d := range diags {
		lines = append(lines, fmt.Sprintf("  %s %s: %s: %s", severityName(d.Severity), d.Subject, d.Summary, d.Detail))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
