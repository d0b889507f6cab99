package flowtest

import (
	"context"
	"testing"

	"github.com/flowrun/flowrun/flow/testfile"
)

// runSource runs a test file given as text against a pipeline given as text.
func runSource(t *testing.T, pipeline, tests string) []*RunResult {
	t.Helper()
	plan := compile(t, pipeline)
	file, diags := testfile.LoadSource("p.flowtest.hcl", []byte(tests))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if diags := file.Check(plan); diags.HasErrors() {
		t.Fatal(diags)
	}
	return RunFile(context.Background(), file, plan, harnessOptions(t))
}

// failures lists the failures of results as text, for t.Fatal.
func failures(results []*RunResult) string {
	s := ""
	for _, r := range results {
		if r.Err != nil {
			s += r.Run + ": " + r.Err.Error() + "\n"
		}
		for _, f := range r.Failures {
			s += r.Run + ": " + f.Summary + "\n" + f.Diff + "\n"
			for _, w := range f.Why {
				s += "  " + w + "\n"
			}
		}
	}
	return s
}

// keyedPipeline passes a keyed topic to a sink.
const keyedPipeline = `
pipeline "k" { key_prefix = "k" }
topic "in" {
  partitions = 2
  key        = msg.k
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`

// A step's messages go out in the order of their at, not the order they are written: the message
// written first but due later arrives after the other of its key.
func TestSendsGoOutInTheOrderOfTheirAt(t *testing.T) {
	results := runSource(t, keyedPipeline, `
run "out of order" {
  send {
    topic    = topic.in
    messages = [
      { payload = { k = "a", n = 2 }, at = "+10s" },
      { payload = { k = "a", n = 1 }, at = "+1s" },
    ]
  }
  expect {
    sink     = sink.out
    messages = [{ k = "a", n = 1 }, { k = "a", n = 2 }]
  }
}
`)
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("want the run to pass:\n%s", failures(results))
	}
	if results[0].Virtual != 10*1e9 {
		t.Fatalf("the run took %s of virtual time, want 10s (the last message's at)", results[0].Virtual)
	}
}
