package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A lookup stage adds to each order the row of its customer in a table, read from the table
// stage's state in whichever partition holds the customer. These tests compute what each order
// must carry from what the test wrote, and compare, order by order.

// lookupPipeline is orders (4 partitions, keyed by order id) enriched with a customers table whose
// topic (3 partitions) is keyed by topicKey, and the table by tableKey ("": its topic's key), into
// the stream out.
func lookupPipeline(prefix, topicKey, tableKey, delivery string) string {
	keyPrefix := ""
	if prefix != "" {
		keyPrefix = fmt.Sprintf("key_prefix = %q", prefix)
	}
	return fmt.Sprintf(`
pipeline "lookups" {
  %s
  delivery = %q
}
variable "out" {}
topic "customers" {
  partitions = 3
  key        = %s
}
topic "orders" {
  partitions = 4
  key        = msg.order_id
}
table "customers" {
  input = topic.customers
  %s
}
stage "enriched" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.enriched
  stream = var.out
}
`, keyPrefix, delivery, topicKey, tableKey)
}

// customerRow is customer i's payload at version v.
func customerRow(i, v int) string {
	return fmt.Sprintf(`{"customer_id":"c%d","region":"r%d","v":%d}`, i, i%5, v)
}

// customerTable is what the test writes to the customers topic, and the table it makes.
type customerTable struct {
	rows map[string]map[string]any // the latest row of each customer; deleted ones absent
}

// publishCustomers writes n customers, then a second version of every tenth, then (with deletes)
// deletes every 25th but one: the latest row of each is what a lookup must find.
func publishCustomers(t *testing.T, c *redis.Client, plan *flow.Plan, n int, deletes bool) customerTable {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	table := customerTable{rows: map[string]map[string]any{}}
	put := func(i, v int) {
		row := customerRow(i, v)
		if err := pub.Publish(ctx, "customers", stages.NewMessage("", []byte(row), nil)); err != nil {
			t.Fatal(err)
		}
		table.rows[fmt.Sprintf("c%d", i)] = jsonObject(t, row)
	}
	for i := range n {
		put(i, 1)
	}
	for i := 0; i < n; i += 10 {
		put(i, 2)
	}
	if deletes {
		for i := 1; i < n; i += 25 {
			key := fmt.Sprintf("c%d", i)
			if err := pub.Publish(ctx, "customers", stages.NewMessage(key, []byte("null"), nil)); err != nil {
				t.Fatal(err)
			}
			delete(table.rows, key)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return table
}

// publishOrders writes orders from..to-1; order i is of customer c(i % customers).
func publishLookupOrders(t *testing.T, c *redis.Client, plan *flow.Plan, from, to, customers int) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]stages.Message, 0, to-from)
	for i := from; i < to; i++ {
		msgs = append(msgs, stages.NewMessage("", []byte(fmt.Sprintf(`{"order_id":"o%d","customer_id":"c%d","n":%d}`, i, i%customers, i)), nil))
	}
	if err := pub.PublishBatch(ctx, "orders", msgs); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkLookups compares the enriched orders in out with the table: each order from..to-1 once,
// with its customer's latest row, or null.
func checkLookups(t *testing.T, got []map[string]any, table customerTable, n, customers int) {
	t.Helper()
	seen := map[string]int{}
	missing := 0
	for _, m := range got {
		id, _ := m["order_id"].(string)
		seen[id]++
		want, ok := table.rows[m["customer_id"].(string)]
		if !ok {
			missing++
			if m["customer"] != nil {
				t.Fatalf("order %s of a customer the table does not hold: customer = %v, want null", id, m["customer"])
			}
			continue
		}
		if !reflect.DeepEqual(normalise(t, m["customer"]), want) {
			t.Fatalf("order %s: customer = %v, want %v", id, m["customer"], want)
		}
	}
	for i := range n {
		if id := fmt.Sprintf("o%d", i); seen[id] != 1 {
			t.Fatalf("order %s arrived %d times, want once", id, seen[id])
		}
	}
	if len(got) != n {
		t.Fatalf("%d enriched orders, want %d", len(got), n)
	}
	if missing == 0 {
		t.Fatal("no order of a customer the table does not hold: the test checks nothing of missing rows")
	}
}

// normalise makes a row decoded from an output comparable with one decoded by jsonObject.
func normalise(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return jsonObject(t, string(b))
}

// TestLookupJobIsExact looks up 5,000 orders in a table of 500 customers written before them
// (with updates, and deletes by null payloads), some of customers that do not exist, as a job: each
// order comes out once, with its customer's latest row or null. The table keyed like its topic
// reads it directly; keyed otherwise, through a repartition topic, the catch-up waits hop by hop.
func TestLookupJobIsExact(t *testing.T) {
	t.Parallel()
	const customers, orders, referenced = 500, 5000, 550
	for _, b := range []backend{server, cluster} {
		for _, v := range []struct {
			name, topicKey, tableKey string
			deletes                  bool
		}{
			{"keyed like its topic", "msg.customer_id", "", true},
			{"keyed otherwise", "msg.region", "key = msg.customer_id", false},
		} {
			t.Run(b.name+"/"+v.name, func(t *testing.T) {
				c := b.open(t)
				out := fmt.Sprintf("lookup-out-%d", prefixes.Add(1))
				plan := buildSource(t, lookupPipeline("", v.topicKey, v.tableKey, "at_least_once"), "out="+out)
				if got := plan.Table("customers").Stage.Input.Repartition != nil; got != !v.deletes {
					t.Fatalf("repartition topic: %v", got)
				}
				table := publishCustomers(t, c, plan, customers, v.deletes)
				publishLookupOrders(t, c, plan, 0, orders, referenced)
				j := runJob(t, c, plan, runtime.Options{})
				checkLookups(t, streamPayloads(t, c, out), table, orders, referenced)
				if s := j.node(t, "enriched"); s.In != orders || s.Out != orders {
					t.Errorf("lookup counts %+v", s)
				}
				written := customers + customers/10
				if v.deletes {
					written += customers / 25
				}
				if s := j.node(t, "customers.table"); s.In != int64(written) || s.Absorbed != int64(written) {
					t.Errorf("table counts %+v, want %d absorbed", s, written)
				}
				if !strings.Contains(j.log, "the table has caught up with its topic") {
					t.Errorf("the catch-up is not logged:\n%s", j.log)
				}
			})
		}
	}
}

// TestLookupSeesUpdatesAfterCatchUp runs a lookup as a service: once the table has caught up, an
// update of a customer is written, and once the table's stage has committed it (as Redis says:
// its group has delivered and acknowledged it), the orders written next carry the new row.
func TestLookupSeesUpdatesAfterCatchUp(t *testing.T) {
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := fmt.Sprintf("lookup-out-%d", prefixes.Add(1))
			plan := buildSource(t, lookupPipeline("", "msg.customer_id", "", "at_least_once"), "out="+out)
			table := publishCustomers(t, c, plan, 50, true)
			svc := startService(t, c, plan, runtime.Options{})
			waitFor(t, "the table to catch up", func() bool {
				return strings.Contains(svc.log.String(), "the table has caught up with its topic")
			})
			committed := func(version int) {
				pub, err := runtime.NewPublisher(c, plan)
				if err != nil {
					t.Fatal(err)
				}
				row := customerRow(7, version)
				if err := pub.Publish(context.Background(), "customers", stages.NewMessage("", []byte(row), nil)); err != nil {
					t.Fatal(err)
				}
				if err := pub.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				table.rows["c7"] = jsonObject(t, row)
				keys := redis.Keys{Prefix: plan.KeyPrefix}
				streams := keys.Streams("customers", 3)
				waitFor(t, "the table's stage to commit the update", func() bool {
					ends, err := c.LastIDs(context.Background(), streams)
					if err != nil {
						t.Fatal(err)
					}
					progress, err := c.GroupsProgress(context.Background(), streams, "customers.table")
					if err != nil {
						t.Fatal(err)
					}
					for p := range streams {
						if !progress[p].Committed(ends[p]) {
							return false
						}
					}
					return true
				})
			}
			for round, version := range []int{3, 4} {
				committed(version)
				from := round * 100
				publishLookupOrders(t, c, plan, from, from+100, 10) // customers c0..c9: c7 among them
				waitFor(t, "the orders to be enriched", func() bool { return len(streamPayloads(t, c, out)) == from+100 })
				got := streamPayloads(t, c, out)
				var seven int
				for _, m := range got[from:] {
					if m["customer_id"] == "c7" {
						seven++
						if v := fmt.Sprint(m["customer"].(map[string]any)["v"]); v != fmt.Sprint(version) {
							t.Fatalf("order %s of c7 carries version %s, want %d", m["order_id"], v, version)
						}
					}
				}
				if seven != 10 {
					t.Fatalf("%d orders of c7, want 10", seven)
				}
			}
			svc.stop()
		})
	}
}

// TestLookupDeadLettersMissingKeys looks orders up with missing = "dead_letter", fused with a map
// after it and unfused: an order of a customer the table does not hold goes to the lookup's dead
// letters alone (not on to the map, not to the output) and counts as dead-lettered, not as passed
// on; every other order comes out once, with its row.
func TestLookupDeadLettersMissingKeys(t *testing.T) {
	const customers, orders, referenced = 50, 400, 60
	for _, noFusion := range []bool{false, true} {
		t.Run(fmt.Sprintf("fused=%v", !noFusion), func(t *testing.T) {
			c := server.open(t)
			out := fmt.Sprintf("lookup-out-%d", prefixes.Add(1))
			src := strings.Replace(lookupPipeline("", "msg.customer_id", "", "at_least_once"), `  as      = "customer"`,
				`  as      = "customer"
  missing = "dead_letter"`, 1)
			src = strings.Replace(src, "input  = stage.enriched", "input  = stage.marked", 1) + `
stage "marked" {
  kind  = "map"
  input = stage.enriched
  set   = { marked = true }
}
`
			plan := buildSource(t, src, "out="+out)
			table := publishCustomers(t, c, plan, customers, false)
			publishLookupOrders(t, c, plan, 0, orders, referenced)
			j := runJob(t, c, plan, runtime.Options{NoFusion: noFusion})
			var missing int64
			for i := range orders {
				if _, ok := table.rows[fmt.Sprintf("c%d", i%referenced)]; !ok {
					missing++
				}
			}
			got := streamPayloads(t, c, out)
			for _, m := range got {
				if _, ok := table.rows[fmt.Sprint(m["customer_id"])]; !ok || m["marked"] != true {
					t.Fatalf("an order in the output: %v", m)
				}
			}
			if int64(len(got)) != orders-missing {
				t.Errorf("%d orders out, want the %d of customers the table holds", len(got), orders-missing)
			}
			dead, err := c.Universal().XLen(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.DeadLetter("enriched")).Result()
			if err != nil {
				t.Fatal(err)
			}
			if dead != missing {
				t.Errorf("%d dead letters of the lookup, want %d", dead, missing)
			}
			if s := j.node(t, "enriched"); s.In != orders || s.Out != orders-missing || s.DeadLettered != missing {
				t.Errorf("lookup counts %+v, want %d in, %d out, %d dead-lettered", s, orders, orders-missing, missing)
			}
			if s := j.node(t, "marked"); s.In != orders-missing || s.Out != orders-missing {
				t.Errorf("map counts %+v, want %d in and out", s, orders-missing)
			}
		})
	}
}

// TestLookupExactlyOnceThroughKillCycles runs the lookup with effectively-once delivery in flowrun
// processes that are killed mid-stream, over and over, then to the end as a job: every order comes
// out exactly once, with its customer's row.
func TestLookupExactlyOnceThroughKillCycles(t *testing.T) {
	t.Parallel()
	bin := flowrunBinary(t)
	for _, v := range []struct{ name, table string }{{"partitioned", ""}, {"global", "global = true"}} {
		for _, b := range processBackends {
			t.Run(v.name+"/"+b.name, func(t *testing.T) { lookupThroughKillCycles(t, bin, b.urls(t), v.table) })
		}
	}
}

// lookupThroughKillCycles is TestLookupExactlyOnceThroughKillCycles on one backend, with the table
// block's extra attributes.
func lookupThroughKillCycles(t *testing.T, bin string, urls []string, tableAttrs string) {
	const customers, orders, referenced, cycles = 200, 6000, 220, 10
	c := openURLs(t, urls...)
	prefix := fmt.Sprintf("killlookup-%d", prefixes.Add(1))
	out := prefix + ":out"
	path := filepath.Join(t.TempDir(), "lookups.hcl")
	writeFile(t, path, lookupPipeline(prefix, "msg.customer_id", tableAttrs, "effectively_once"))
	plan, _, diags := flow.Build(path, flow.Options{Vars: []string{"out=" + out}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	table := publishCustomers(t, c, plan, customers, true)
	publishLookupOrders(t, c, plan, 0, orders, referenced)
	keys := redis.Keys{Prefix: prefix}
	inputs := keys.Streams("orders", 4)
	backlog := func() int {
		n := 0
		for _, s := range inputs {
			n += int(backlogOf(t, c, s, "enriched"))
		}
		return n
	}
	// Small batches: many commits, so that the kills fall among them.
	args := append([]string{"run", path, "--var", "out=" + out, "--lease-ttl", "300ms", "--batch-size", "50"}, redisArgs(urls)...)
	outLen := func() int {
		n, err := c.Universal().XLen(context.Background(), out).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	var logs []string
	midBatch, cycle := 0, 0
	for ; cycle < cycles && backlog() > 1000; cycle++ {
		// The kill point: a random number more orders out, polled without pause, as a process
		// looks up hundreds of orders in milliseconds (waitFor's pace would let it finish).
		target := outLen() + 50 + rand.IntN(200)
		p := startBinary(t, bin, args...)
		for deadline := time.Now().Add(time.Minute); outLen() < target || mostDelivered(t, c, "enriched", inputs...) > 2; {
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: the output did not reach %d orders in a minute", cycle, target)
			}
		}
		p.kill(t)
		if pendingFor(t, c, keys, "orders", 4, "enriched", "") > 0 {
			midBatch++
		}
		logs = append(logs, p.log.String())
	}
	last := startBinary(t, bin, append(args, "--until-drained")...)
	if err := waitProcess(t, last); err != nil {
		t.Fatalf("the last process, run as a job to the end: %v\n%s", err, last.log.String())
	}
	checkLookups(t, streamPayloads(t, c, out), table, orders, referenced)
	if cycle < 3 || midBatch == 0 {
		t.Errorf("%d SIGKILL cycles, %d with batches in flight: too few to test anything", cycle, midBatch)
	}
	t.Logf("%d SIGKILL cycles, %d with batches in flight, %d leases lost", cycle, midBatch, leaseLosses(append(logs, last.log.String())...))
}
