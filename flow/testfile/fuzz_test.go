package testfile_test

import (
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
)

// FuzzLoad feeds arbitrary bytes through the test-file decoder, native or JSON syntax, and
// checks what decodes against a pipeline: problems must be diagnostics, never panics. The seed
// corpus in testdata/fuzz/FuzzLoad holds the test-file fixtures.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`run "r" { expect { sink = sink.out, count = 1 } }`), false)
	f.Add([]byte(`{"run": {"r": {"expect": {"sink": "sink.out", "count": 1}}}}`), true)
	plan, _, diags := flow.Build(testPipeline, flow.Options{
		GoFuncs:   []string{"acme.score"},
		LookupEnv: func(string) (string, bool) { return "", false },
	})
	if diags.HasErrors() {
		f.Fatal(diags)
	}
	f.Fuzz(func(t *testing.T, src []byte, asJSON bool) {
		name := "fuzz" + flow.TestFileExt
		if asJSON {
			name = "fuzz" + flow.TestFileJSONExt
		}
		tf, diags := testfile.LoadSource(name, src)
		if tf == nil {
			t.Fatal("no test file")
		}
		diags = append(diags, tf.Check(plan)...)
		for _, d := range diags {
			if d.Severity == 0 || d.Summary == "" {
				t.Fatalf("malformed diagnostic %#v", d)
			}
		}
		for _, r := range tf.Runs {
			if len(r.Steps) == 0 {
				t.Fatalf("run %q has no steps", r.Name)
			}
		}
	})
}
