package runtime_test

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// An aggregate whose group_by is not its input's key reads a repartition topic that every input
// partition writes. Each writes its events in order of event time, at its own pace: with the
// watermark the slowest writer's, no event is late and the job's windows are exact, on every
// backend.
func TestRepartitionedAggregateCountsExactly(t *testing.T) {
	t.Parallel()
	const n, customers, regions = 400, 5, 4
	src := `
pipeline "regions" {}
variable "out" {}
topic "orders" {
  partitions = 4
  key        = msg.region
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(n) + `
  output = topic.orders
  # An order every 5 seconds of event time, regions and customers in turn.
  template = {
    region   = "r${index % ` + strconv.Itoa(regions) + `}"
    customer = "c${index % ` + strconv.Itoa(customers) + `}"
    amount   = index
    at       = index * 5000
  }
}
stage "per_customer" {
  kind       = "aggregate"
  input      = topic.orders
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    orders  = count()
    revenue = sum(msg.amount)
  }
}
sink "out" {
  kind  = "file"
  input = stage.per_customer
  path  = var.out
}
`
	want := map[aggregateWindow][2]int{} // orders, revenue
	for i := 0; i < n; i++ {
		w := aggregateWindow{"c" + strconv.Itoa(i%customers), time.UnixMilli(int64(i) * 5000 / 60000 * 60000).UTC().Format(time.RFC3339), ""}
		got := want[w]
		want[w] = [2]int{got[0] + 1, got[1] + i}
	}
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, src, "out="+out)
			if plan.Stages[0].Name != "per_customer.by_key" {
				t.Fatalf("no repartition stage: %v", plan.Stages)
			}
			j := runJob(t, c, plan, runtime.Options{})
			if d := j.summary.DeadLettered(); d != 0 {
				t.Fatalf("%d messages dead-lettered (late?)\n%s", d, j.log)
			}
			eachWindowOnce(t, jsonLines(t, readFile(t, out)), want, "orders", windowOf)
		})
	}
}
