package runtime_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// TestAWindowAfterALookupAsOfIsExact: an aggregate that counts orders per customer tier in
// tumbling windows of their created_at, after a lookup as of created_at. The orders created after
// the table's last version wait in the lookup's state until the job's end closes the table, while
// the lookup's input watermark is already past them: the lookup holds the watermark it passes on
// at its earliest waiting order, so none comes late to the windows, and every window's count
// equals the one computed here from the versions that held at each order's created_at.
func TestAWindowAfterALookupAsOfIsExact(t *testing.T) {
	t.Parallel()
	const windowMS = 10_000
	rng := rand.New(rand.NewPCG(23, 5))
	var versions, orders []string
	history := map[string][][2]int64{} // customer -> [updated_at, tier], in time order
	add := func(c string, at, tier int64) {
		versions = append(versions, fmt.Sprintf(`{"customer_id":%q,"updated_at":%d,"tier":%d}`, c, at, tier))
		history[c] = append(history[c], [2]int64{at, tier})
	}
	for c := range 10 {
		add(fmt.Sprintf("c%d", c), asOfT0-10_000+int64(c), 0)
	}
	for i := range 1000 {
		add(fmt.Sprintf("c%d", rng.IntN(10)), asOfT0+int64(i)*100, int64(rng.IntN(3)))
	}
	want := map[string]int{} // "tier@window start (RFC 3339)" -> orders
	for i := range 3000 {
		// In created_at order, as a source would write them: late only if the lookup made them so.
		c, at := fmt.Sprintf("c%d", rng.IntN(10)), asOfT0+int64(i)*200/3
		orders = append(orders, fmt.Sprintf(`{"order_id":"o%d","customer_id":%q,"created_at":%d}`, i, c, at))
		tier := int64(-1)
		for _, v := range history[c] {
			if v[0] <= at {
				tier = v[1]
			}
		}
		want[fmt.Sprintf("%d@%s", tier, time.UnixMilli(at-at%windowMS).UTC().Format(time.RFC3339))]++
	}
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			prefix := fmt.Sprintf("asofwin-%d", prefixes.Add(1))
			out := prefix + ":out"
			plan := buildSource(t, fmt.Sprintf(`
pipeline "asofwin" {
  key_prefix = %q
}
variable "out" {}
topic "customers" {
  partitions = 3
  key        = msg.customer_id
}
topic "orders" {
  partitions = 4
  key        = msg.order_id
}
table "customers" {
  input      = topic.customers
  history    = "1000h"
  event_time = msg.updated_at
}
stage "enriched" {
  kind  = "lookup"
  input = topic.orders
  table = table.customers
  key   = msg.customer_id
  as    = "customer"
  as_of = msg.created_at
}
stage "per_tier" {
  kind       = "aggregate"
  input      = stage.enriched
  group_by   = msg.customer.tier
  event_time = msg.created_at
  window {
    type = "tumbling"
    size = "10s"
  }
  late      = "dead_letter"
  aggregate = { n = count() }
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.per_tier
  stream = var.out
}
`, prefix), "out="+out)
			publishAll(t, c, plan, "customers", versions)
			publishAll(t, c, plan, "orders", orders)
			j := runJob(t, c, plan, runtime.Options{})
			if late := summaryNode(j.summary, "per_tier").Late; late != 0 {
				t.Errorf("%d orders came late to the windows, want none", late)
			}
			got := map[string]int{}
			for _, r := range streamPayloads(t, c, out) {
				got[fmt.Sprintf("%v@%v", r["key"], r["window"].(map[string]any)["start"])] += int(r["n"].(float64))
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("counts per tier and window:\n got %v\nwant %v", got, want)
			}
		})
	}
}
