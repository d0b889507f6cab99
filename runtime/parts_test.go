package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"testing"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// partsPipeline is a fused chain of inline stages on one partition: its batches of 1000 are split
// in parts processed at once (runtime/lanes.go, computeParts).
const partsPipeline = `
pipeline "parts" {}
topic "in" {
  key = msg.k
}
topic "out" {}
stage "stamp" {
  kind  = "map"
  input = topic.in
  set   = { stamped = msg.n * 2 }
}
stage "thirds" {
  kind   = "filter"
  input  = stage.stamp
  output = topic.out
  where  = msg.n % 3 != 0
}
`

// TestAnInlineChainSplitInPartsKeepsTheBatchsOrder: a backlog of 5,000 messages on one partition
// goes through a fused map and filter, batches split in parts on more than one core, and comes out
// exactly: every message that passes, once, stamped, in the order it went in, and counters that add
// up.
func TestAnInlineChainSplitInPartsKeepsTheBatchsOrder(t *testing.T) {
	if goruntime.GOMAXPROCS(0) < 2 {
		defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(2))
	}
	const total = 5000
	c := server.open(t)
	plan := buildSource(t, partsPipeline)
	if len(plan.Chains) != 1 {
		t.Fatalf("chains %v, want stamp+thirds fused", plan.Chains)
	}
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for n := range total {
		payload := fmt.Sprintf(`{"k":"k%d","n":%d}`, n%7, n)
		if err := pub.Publish(context.Background(), "in", stages.NewMessage("", []byte(payload), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	j := runJob(t, c, plan, runtime.Options{})

	recs := readAll(t, c, redis.Keys{Prefix: plan.KeyPrefix}.Stream("out", 0))
	want := 0
	for _, rec := range recs {
		for want%3 == 0 {
			want++
		}
		var got struct{ N, Stamped int }
		if err := json.Unmarshal(rec.Payload, &got); err != nil || got.N != want || got.Stamped != 2*want {
			t.Fatalf("entry %s is %s (%v), want n = %d stamped %d", rec.ID, rec.Payload, err, want, 2*want)
		}
		want++
	}
	if passed := total - (total+2)/3; len(recs) != passed {
		t.Fatalf("%d entries out, want %d", len(recs), passed)
	}
	for _, n := range j.summary.Nodes {
		switch n.Name {
		case "stamp":
			if n.In != total || n.Out != total {
				t.Errorf("stamp: in %d out %d, want %d each", n.In, n.Out, total)
			}
		case "thirds":
			if n.In != total || n.Out != int64(len(recs)) || n.Filtered != total-int64(len(recs)) {
				t.Errorf("thirds: in %d out %d filtered %d, want %d, %d, %d", n.In, n.Out, n.Filtered, total, len(recs), total-len(recs))
			}
		}
	}
}
