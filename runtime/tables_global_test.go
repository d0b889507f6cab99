package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A global table keeps every row in one partition's state, read by every lookup: its stage reads a
// repartition topic of one partition where the table's topic has several. These tests check that
// the whole table is in that one hash, exact, with lookups as of an event time too.

// TestGlobalTableJobIsExact looks 5,000 orders up in a global table of 500 customers (with updates
// and deletes) whose topic has 3 partitions, as a job, on a server and a cluster: each order once
// with its customer's latest row or null, and every row in the one state hash of the table.
func TestGlobalTableJobIsExact(t *testing.T) {
	t.Parallel()
	const customers, orders, referenced = 500, 5000, 550
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := fmt.Sprintf("global-out-%d", prefixes.Add(1))
			plan := buildSource(t, lookupPipeline("", "msg.customer_id", "global = true", "at_least_once"), "out="+out)
			in := plan.Table("customers").Stage.Input
			if in.Partitions != 1 || in.Repartition == nil {
				t.Fatalf("the global table's stage reads %s, of %d partitions: want a repartition topic of one", in.Name, in.Partitions)
			}
			table := publishCustomers(t, c, plan, customers, true)
			publishLookupOrders(t, c, plan, 0, orders, referenced)
			runJob(t, c, plan, runtime.Options{})
			checkLookups(t, streamPayloads(t, c, out), table, orders, referenced)

			rows, err := c.Universal().HGetAll(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.State(in.Name, 0, "customers.table")).Result()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for k, v := range rows {
				if strings.HasPrefix(k, "\x00") {
					continue
				}
				n++
				if want, ok := table.rows[k]; !ok || fmt.Sprint(jsonObject(t, v)) != fmt.Sprint(want) {
					t.Fatalf("the table's hash holds %s = %s, want %v", k, v, want)
				}
			}
			if n != len(table.rows) {
				t.Fatalf("the table's one hash holds %d rows, want %d", n, len(table.rows))
			}
		})
	}
}

// TestGlobalTableAsOfIsExact runs the lookup as of an event time against a global table, as a
// service, orders first then versions (each order waits for the table's one watermark): each order
// with the version that held at its created_at.
func TestGlobalTableAsOfIsExact(t *testing.T) {
	d := newAsOfData(t, 2000, 13)
	c := server.open(t)
	prefix := fmt.Sprintf("globalasof-%d", prefixes.Add(1))
	out := prefix + ":out"
	src := strings.Replace(asOfPipeline(prefix, "effectively_once"), `history    = "1000h"`, "history = \"1000h\"\n  global = true", 1)
	plan := buildSource(t, src, "out="+out)
	if in := plan.Table("customers").Stage.Input; in.Partitions != 1 {
		t.Fatalf("the global table's stage reads %d partitions", in.Partitions)
	}
	svc := startService(t, c, plan, runtime.Options{})
	waitFor(t, "the table to catch up", func() bool {
		return strings.Contains(svc.log.String(), "the table has caught up with its topic")
	})
	publishAll(t, c, plan, "orders", d.orders)
	consumed(t, c, plan, "orders", 4, "enriched")
	publishAll(t, c, plan, "customers", d.versions)
	publishAll(t, c, plan, "customers", d.sentinels)
	waitFor(t, "every order to be enriched", func() bool { return len(streamPayloads(t, c, out)) >= len(d.orders) })
	svc.stop()
	checkAsOf(t, streamPayloads(t, c, out), d)
}
