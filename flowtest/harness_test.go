package flowtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/flowrun/flowrun/flow"
	_ "github.com/flowrun/flowrun/stages"
)

const retryPipeline = `
pipeline "pay" { key_prefix = "pay" }
retry "webhook" {
  max_attempts = 5
  backoff      = "exponential"
  initial      = "2s"
  max          = "30s"
}
topic "payments" {
  partitions = 4
  key        = msg.account
}
stage "big" {
  kind  = "filter"
  input = topic.payments
  where = msg.amount > 10
}
sink "ledger" {
  kind  = "http"
  input = stage.big
  url   = "http://127.0.0.1:1/ledger"
  retry = retry.webhook
}
`

func compile(t *testing.T, src string) *flow.Plan {
	t.Helper()
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(src)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return plan
}

func payloadOf(payload string) flow.TestMessage { return flow.TestMessage{Payload: []byte(payload)} }

func TestHarnessRetriesOnTheVirtualClock(t *testing.T) {
	plan := compile(t, retryPipeline)
	file := &flow.TestFile{
		Path:      "p.flowtest.hcl",
		Overrides: []*flow.TestSinkOverride{{Sink: "ledger", Responses: []int{503, 503, 503, 503, 200}}},
		Runs: []*flow.TestRun{{
			Name: "retries",
			Steps: []*flow.TestStep{{Sends: []*flow.TestSend{{Topic: "payments", Messages: []flow.TestMessage{
				payloadOf(`{"account":"a","amount":5}`), payloadOf(`{"account":"a","amount":50}`),
			}}}}},
			Expect: []*flow.TestExpect{{Sink: "ledger", HasCount: true, Count: 1}},
		}},
	}
	var log *os.File
	if testing.Verbose() {
		log = os.Stderr
	}
	opts := Options{}
	if log != nil {
		opts.Log = log
	}
	start := time.Now()
	results := RunFile(context.Background(), file, plan, opts)
	t.Logf("wall %s", time.Since(start))
	for _, r := range results {
		t.Logf("%s: passed=%v err=%v failures=%v virtual=%s wall=%s seen=%d", r.Run, r.Passed(), r.Err, r.Failures, r.Virtual, r.Wall, len(r.Seen["sink.ledger"]))
	}
	_ = hcl.Range{}
}

func TestHarnessLongAdvance(t *testing.T) {
	plan := compile(t, retryPipeline)
	file := &flow.TestFile{
		Path: "p.flowtest.hcl",
		Runs: []*flow.TestRun{{Name: "idle", Steps: []*flow.TestStep{{Advance: 10 * time.Minute}}}},
	}
	start := time.Now()
	results := RunFile(context.Background(), file, plan, Options{})
	for _, r := range results {
		t.Logf("%s: passed=%v err=%v virtual=%s wall=%s (total %s) ", r.Run, r.Passed(), r.Err, r.Virtual, r.Wall, time.Since(start))
	}
}
