package runtime_test

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// An aggregate stage's job emits every window once, with exact counts and sums: those the watermark
// closed while the job ran, and, once the input is drained, those still open.
func TestAggregateJobEmitsEveryWindowOnce(t *testing.T) {
	const n, customers = 300, 3
	src := `
pipeline "revenue" {}
variable "out" {}
topic "orders" {
  partitions = 3
  key        = msg.customer
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(n) + `
  output = topic.orders
  # An order every 10 seconds of event time, customers in turn, amounts 0 to n-1.
  template = {
    customer = "c${index % ` + strconv.Itoa(customers) + `}"
    amount   = index
    at       = index * 10000
  }
}
stage "per_minute" {
  kind       = "aggregate"
  input      = topic.orders
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    orders  = count()
    revenue = sum(msg.amount)
    high    = max(msg.amount)
  }
}
sink "out" {
  kind  = "file"
  input = stage.per_minute
  path  = var.out
}
`
	type window struct {
		customer, start string
	}
	want := map[window][2]int{} // orders, revenue
	for i := 0; i < n; i++ {
		w := window{"c" + strconv.Itoa(i%customers), time.UnixMilli(int64(i) * 10000 / 60000 * 60000).UTC().Format(time.RFC3339)}
		got := want[w]
		want[w] = [2]int{got[0] + 1, got[1] + i}
	}
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			runJob(t, c, buildSource(t, src, "out="+out), runtime.Options{})
			got := jsonLines(t, readFile(t, out))
			if len(got) != len(want) {
				t.Fatalf("%d windows emitted, want %d", len(got), len(want))
			}
			seen := map[window]bool{}
			for _, m := range got {
				w := window{m["key"].(string), m["window"].(map[string]any)["start"].(string)}
				if seen[w] {
					t.Fatalf("window %v emitted twice", w)
				}
				seen[w] = true
				exp, ok := want[w]
				if !ok || int(m["orders"].(float64)) != exp[0] || int(m["revenue"].(float64)) != exp[1] {
					t.Errorf("window %v: %v, want %d orders and %d revenue", w, m, exp[0], exp[1])
				}
			}
		})
	}
}
