package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestTableTTLForgetsKeys runs a table with ttl = "10s" over one partition, in event time: c0 is
// written at 0 s, c1 at 0 s and again at 8 s, c2 at 15 s, c3 at 4 s with history (versions) and
// c4 at 1 s then deleted, all before orders that look them up (processing time). The watermark
// is 15 s: c0 and c3 are forgotten (10 s past their last update), c1 and c2 kept, c4 deleted; an
// update of an expired key (c0 again at 30 s, after the watermark has passed its time) starts it
// afresh, and the second run of orders sees it.
func TestTableTTLForgetsKeys(t *testing.T) {
	for _, history := range []string{"", `history = "1h"`} {
		t.Run(map[string]string{"": "one version", `history = "1h"`: "history"}[history], func(t *testing.T) {
			c := server.open(t)
			prefix := fmt.Sprintf("ttl-%d", prefixes.Add(1))
			out := prefix + ":out"
			src := strings.NewReplacer(`history    = "1000h"`, history+"\n  ttl = \"10s\"",
				"partitions = 3", "partitions = 1", `as_of = msg.created_at`, "").Replace(asOfPipeline(prefix, "at_least_once"))
			plan := buildSource(t, src, "out="+out)
			row := func(c string, at int64, v int) string {
				return fmt.Sprintf(`{"customer_id":%q,"updated_at":%d,"v":%d}`, c, asOfT0+at, v)
			}
			publishAll(t, c, plan, "customers", []string{row("c0", 0, 1), row("c1", 0, 1), row("c4", 1000, 1), row("c3", 4000, 1),
				row("c1", 8000, 2), row("c2", 15_000, 1)})
			pub, err := runtime.NewPublisher(c, plan)
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish(context.Background(), "customers", stages.NewMessage("c4", []byte("null"), nil)); err != nil {
				t.Fatal(err)
			}
			if err := pub.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			lookups := func(round int) map[string]any {
				var orders []string
				for i := range 5 {
					orders = append(orders, fmt.Sprintf(`{"order_id":"r%do%d","customer_id":"c%d","created_at":0}`, round, i, i))
				}
				publishAll(t, c, plan, "orders", orders)
				runJob(t, c, plan, runtime.Options{})
				got := map[string]any{}
				for _, m := range streamPayloads(t, c, out) {
					if strings.HasPrefix(m["order_id"].(string), fmt.Sprintf("r%d", round)) {
						if r, ok := m["customer"].(map[string]any); ok {
							got[m["customer_id"].(string)] = fmt.Sprint(r["v"])
						} else {
							got[m["customer_id"].(string)] = nil
						}
					}
				}
				return got
			}
			want := map[string]any{"c0": nil, "c1": "2", "c2": "1", "c3": nil, "c4": nil}
			if got := lookups(1); !reflect.DeepEqual(got, want) {
				t.Fatalf("after the first updates the lookups found %v, want %v", got, want)
			}
			// c1 comes back in the batch that moves the watermark past its expiry, before its timer
			// fires: it starts afresh all the same, without the versions of before.
			publishAll(t, c, plan, "customers", []string{row("c0", 30_000, 3), row("c1", 31_000, 3)})
			want = map[string]any{"c0": "3", "c1": "3", "c2": nil, "c3": nil, "c4": nil}
			if got := lookups(2); !reflect.DeepEqual(got, want) {
				t.Fatalf("after c0 and c1 came back at 30 s the lookups found %v, want %v", got, want)
			}
			entry, _, err := c.ReadState(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.State("customers", 0, "customers.table"), "c1")
			if err != nil {
				t.Fatal(err)
			}
			var versions []json.RawMessage
			if err := json.Unmarshal(entry, &versions); err != nil || len(versions) != 1 {
				t.Fatalf("c1 holds %s, want its one version of 31 s (%v)", entry, err)
			}
		})
	}
}
