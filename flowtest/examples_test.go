package flowtest_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flowtest"
	"github.com/flowrun/flowrun/stages"
)

const examplesDir = "../examples/pipelines"

// TestEveryExampleShipsPassingTests runs the test files of every example pipeline, as
// `flowrun test examples/pipelines/*` does.
func TestEveryExampleShipsPassingTests(t *testing.T) {
	entries, err := os.ReadDir(examplesDir)
	if err != nil {
		t.Fatal(err)
	}
	examples := 0
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() && (flow.IsTestFile(name) || !(strings.HasSuffix(name, ".hcl") || strings.HasSuffix(name, ".hcl.json"))) {
			continue
		}
		examples++
		path := filepath.Join(examplesDir, e.Name())
		t.Run(e.Name(), func(t *testing.T) {
			tests, files, diags := flow.CheckTests(path, flow.Options{GoFuncs: stages.Names()})
			if diags.HasErrors() {
				t.Fatalf("invalid: %s", diags.Error())
			}
			if len(tests) == 0 {
				t.Fatalf("example %s has no test files: each example ships tests of its happy and failure paths", path)
			}
			for _, tf := range tests {
				results := flowtest.RunFile(context.Background(), tf, tf.Plan, flowtest.Options{Seed: 1})
				if len(results) != len(tf.Runs) {
					t.Errorf("%s: %d results for %d runs", tf.Path, len(results), len(tf.Runs))
				}
				for _, r := range results {
					if !r.Passed() {
						var out bytes.Buffer
						flowtest.WriteText(&out, r, files, true)
						t.Errorf("%s", out.String())
					}
				}
			}
		})
	}
	if examples < 5 {
		t.Fatalf("found %d example pipelines, want at least 5", examples)
	}
}
