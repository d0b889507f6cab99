package flowtest

import (
	"context"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
)

// runSource runs a test file given as text against a pipeline given as text.
// The functions that the file mocks need not be in the binary, as with flowrun test.
func runSource(t *testing.T, pipeline, tests string) []*RunResult {
	t.Helper()
	file, diags := testfile.LoadSource("p.flowtest.hcl", []byte(tests))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(pipeline)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	var funcs []string
	for _, m := range file.AllMocks() {
		funcs = append(funcs, m.Func)
	}
	plan, diags := flow.Compile(cfg, flow.Options{GoFuncs: funcs})
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

// A mock or override_sink inside a run applies to that run alone, in place of the file's: the runs
// before and after it get the file's, which go on where they were; a sink that only one run
// overrides captures without answers in the others.
func TestRunOwnMocksAndOverrides(t *testing.T) {
	results := runSource(t, `
pipeline "m" { key_prefix = "m" }
retry "once" { max_attempts = 1 }
topic "in" { partitions = 1 }
stage "score" {
  kind  = "go"
  func  = "acme.score"
  input = topic.in
}
sink "hook" {
  kind  = "http"
  input = stage.score
  url   = "http://127.0.0.1:1/hook"
  retry = retry.once
}
sink "audit" {
  kind  = "http"
  input = stage.score
  url   = "http://127.0.0.1:1/audit"
  retry = retry.once
}
`, `
mock "acme.score" {
  result {
    output = { id = msg.id, by = "file" }
  }
}
override_sink "hook" {
  responses = [200, 500]
}

run "the file's" {
  send {
    topic    = topic.in
    messages = [{ id = 1 }]
  }
  expect {
    sink     = sink.hook
    messages = [{ id = 1, by = "file" }]
  }
  expect {
    sink     = sink.audit
    messages = [{ id = 1, by = "file" }]
  }
}

run "its own" {
  mock "acme.score" {
    result {
      output = { id = msg.id, by = "run" }
    }
  }
  override_sink "hook" {
    responses = [200]
  }
  override_sink "audit" {
    responses = [503]
  }
  send {
    topic    = topic.in
    messages = [{ id = 2 }]
  }
  expect {
    sink     = sink.hook
    messages = [{ id = 2, by = "run" }]
  }
  expect_dead_letters {
    sink     = sink.audit
    messages = [{ payload = { id = 2, by = "run" }, reason = "503" }]
  }
}

run "the file's again" {
  send {
    topic    = topic.in
    messages = [{ id = 3 }]
  }
  expect_dead_letters {
    sink     = sink.hook
    messages = [{ payload = { id = 3, by = "file" }, reason = "500" }]
  }
  expect {
    sink     = sink.audit
    messages = [{ id = 3, by = "file" }]
  }
}
`)
	if len(results) != 3 {
		t.Fatalf("%d results, want 3:\n%s", len(results), failures(results))
	}
	for _, r := range results {
		if !r.Passed() {
			t.Errorf("run %q failed:\n%s", r.Run, failures([]*RunResult{r}))
		}
	}
}

// minutePipeline counts orders per customer and minute, dropping late ones.
const minutePipeline = `
pipeline "minutes" { key_prefix = "minutes" }
topic "orders" {
  partitions = 1
  key        = msg.customer
}
stage "per_minute" {
  kind       = "aggregate"
  group_by   = msg.customer
  input      = topic.orders
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  late      = "drop"
  aggregate = { orders = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.per_minute
}
`

// When a window's result is missing, the report names the messages that were dropped late, and
// the watermark that the windows still open wait for.
func TestAFailureNamesLateMessagesAndTheWatermark(t *testing.T) {
	results := runSource(t, minutePipeline, `
run "the second minute never closes" {
  send {
    topic    = topic.orders
    messages = [
      { customer = "a", id = "o1", at = "2026-01-01T00:00:10Z" },
      { customer = "a", id = "o2", at = "2026-01-01T00:01:30Z" },
      { customer = "a", id = "o3", at = "2026-01-01T00:00:20Z" },
    ]
  }
  expect {
    sink     = sink.out
    match    = "subset"
    messages = [{ key = "a", orders = 1, window = { start = "2026-01-01T00:01:00Z", end = "2026-01-01T00:02:00Z" } }]
  }
}
`)
	if len(results) != 1 || results[0].Passed() || len(results[0].Failures) != 1 {
		t.Fatalf("want the run to fail once:\n%s", failures(results))
	}
	why := strings.Join(results[0].Failures[0].Why, "\n")
	for _, want := range []string{
		`stage.per_minute dropped 1 of 3 messages (late or repeated): key=a {"at":"2026-01-01T00:00:20Z","customer":"a","id":"o3"} (late)`,
		"stage.per_minute partition 0: its watermark is 2026-01-01T00:01:30Z; 1 timer has not fired, the next at 2026-01-01T00:02:00Z",
	} {
		if !strings.Contains(why, want) {
			t.Errorf("the report does not say %q:\n%s", want, why)
		}
	}
}
