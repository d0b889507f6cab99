package flowtest_test

import (
	"context"
	"fmt"
	"strconv"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/runtime/flowtest"
	"github.com/flowrun/flowrun/stages"
)

// The test kit runs a pipeline's test file (the *.flowtest.hcl language of docs/testing.md) on an
// embedded Redis and a virtual clock, with nothing to start: what `flowrun test` does, and what a
// team's Go test of its stage functions can do. Here a stateful function counts each user's
// clicks; its count, state of the user's partition in Redis, survives a crash of the process.
func ExampleRunFile() {
	stages.RegisterStateful("example.clicks", stages.StatefulFunc{
		Process: func(ctx context.Context, m stages.Message, state stages.State) ([]stages.Message, error) {
			v, _, err := state.Get(ctx, m.Key)
			if err != nil {
				return nil, err
			}
			n, _ := strconv.Atoi(string(v)) // 0 for a user not seen yet
			n++
			if err := state.Put(ctx, m.Key, []byte(strconv.Itoa(n))); err != nil {
				return nil, err
			}
			m.Value["clicks"] = n
			return []stages.Message{m}, nil
		},
	})

	cfg, diags := flow.LoadSource(map[string][]byte{"clicks.hcl": []byte(`
pipeline "clicks" {}
topic "clicks" {
  partitions = 2
  key        = msg.user
}
stage "count" {
  kind  = "go"
  func  = "example.clicks"
  input = topic.clicks
}
sink "counted" {
  kind  = "stdout"
  input = stage.count
}
`)})
	if diags.HasErrors() {
		panic(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		panic(diags)
	}
	tests, diags := testfile.LoadSource("clicks.flowtest.hcl", []byte(`
run "counts each user's clicks" {
  send {
    topic    = topic.clicks
    messages = [{ user = "ann" }, { user = "bob" }, { user = "ann" }]
  }
  expect {
    sink  = sink.counted
    match = "unordered"
    messages = [
      { user = "ann", clicks = 1 },
      { user = "bob", clicks = 1 },
      { user = "ann", clicks = 2 },
    ]
  }
}

run "the counts survive a crash" {
  step {
    crash = true
  }
  step {
    send {
      topic    = topic.clicks
      messages = [{ user = "ann" }]
    }
  }
  expect {
    sink     = sink.counted
    messages = [{ user = "ann", clicks = 3 }]
  }
}
`))
	if diags.HasErrors() {
		panic(diags)
	}
	if diags := tests.Check(plan); diags.HasErrors() {
		panic(diags)
	}

	for _, r := range flowtest.RunFile(context.Background(), tests, plan, flowtest.Options{}) {
		status := "PASS"
		if !r.Passed() {
			status = "FAIL"
		}
		fmt.Printf("%s %s: %d messages at the sink\n", status, r.Run, len(r.Seen["sink.counted"]))
		if r.Err != nil {
			fmt.Println(r.Err)
		}
		for _, f := range r.Failures {
			fmt.Println(f.Summary, f.Diff)
		}
	}
	// Output:
	// PASS counts each user's clicks: 3 messages at the sink
	// PASS the counts survive a crash: 1 messages at the sink
}
