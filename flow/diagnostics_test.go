package flow_test

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/internal/fixturetest"
	_ "github.com/flowrun/flowrun/stages"
)

// testOptions are the compile options of the fixture tests: a binary with two Go stage functions and
// an empty environment.
var testOptions = Options{
	GoFuncs:   []string{"acme.enrich", "acme.score"},
	LookupEnv: func(string) (string, bool) { return "", false },
}

// Each file (or directory) in testdata/diagnostics is a pipeline with one kind of mistake, marked
// as package fixturetest describes: every diagnostic must be expected, every expectation met, and
// every diagnostic located.
func TestDiagnosticFixtures(t *testing.T) {
	entries, err := os.ReadDir("testdata/diagnostics")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		path := filepath.Join("testdata/diagnostics", e.Name())
		t.Run(e.Name(), func(t *testing.T) {
			t.Parallel()
			expectations := fixturetest.ReadExpectations(t, path)
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
				if !fixturetest.Match(d, expectations) {
					t.Errorf("unexpected diagnostic at %s: %s: %s", d.Subject, d.Summary, d.Detail)
				}
				fixturetest.CheckSnippet(t, d, cfg.Files())
			}
			fixturetest.ReportUnmet(t, expectations, diags)
		})
	}
}
