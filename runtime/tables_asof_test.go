package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A lookup with as_of gives each order the version of its customer's row that held at the order's
// created_at, from a table that keeps history. These tests write customers' versions (each with its
// updated_at) and orders, compute in the test which version each order must carry, and check that
// it does, whatever the order in which the orders and the versions arrive, and through SIGKILLs.

// asOfPipeline is lookupPipeline with a versioned table and a lookup as of msg.created_at.
func asOfPipeline(prefix, delivery string) string {
	return fmt.Sprintf(`
pipeline "asof" {
  key_prefix = %q
  delivery   = %q
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
sink "out" {
  kind   = "redis_stream"
  input  = stage.enriched
  stream = var.out
}
`, prefix, delivery)
}

// asOfT0 is the time the test's event times count from, in Unix ms.
const asOfT0 = int64(1_700_000_000_000)

// asOfData is what a test writes: customers' versions in event-time order, orders, and a last
// version per table partition, far later than everything, that moves the table's watermark past
// every order (the table's watermark is the latest updated_at read in each partition).
type asOfData struct {
	versions  []string // payloads, in updated_at order
	orders    []string
	sentinels []string
	want      map[string]map[string]any // per order id: the row it must carry; nil for none
}

// newAsOfData makes n orders of customers c0..c59 (c60..c65 have no row), with created_at spread
// over the span of the versions and a little before it (when no customer has a row yet), and
// 1000 versions, each of a customer drawn at random, 100 ms apart.
func newAsOfData(t *testing.T, n int, seed uint64) asOfData {
	rng := rand.New(rand.NewPCG(seed, 1))
	var d asOfData
	history := map[string][][2]any{} // customer -> [updated_at, row] in time order
	for i := range 1000 {
		c := fmt.Sprintf("c%d", rng.IntN(60))
		at := asOfT0 + int64(i)*100
		row := fmt.Sprintf(`{"customer_id":%q,"updated_at":%d,"v":%d}`, c, at, i)
		d.versions = append(d.versions, row)
		history[c] = append(history[c], [2]any{at, jsonObject(t, row)})
	}
	d.want = map[string]map[string]any{}
	for i := range n {
		id, c := fmt.Sprintf("o%d", i), fmt.Sprintf("c%d", rng.IntN(66))
		at := asOfT0 - 2000 + rng.Int64N(102_000)
		d.orders = append(d.orders, fmt.Sprintf(`{"order_id":%q,"customer_id":%q,"created_at":%d}`, id, c, at))
		var row map[string]any
		for _, v := range history[c] {
			if v[0].(int64) <= at {
				row = v[1].(map[string]any)
			}
		}
		d.want[id] = row
	}
	for p := range 3 {
		for i := 0; ; i++ {
			if key := fmt.Sprintf("sentinel%d", i); redis.Partition(key, 3) == p {
				d.sentinels = append(d.sentinels, fmt.Sprintf(`{"customer_id":%q,"updated_at":%d}`, key, asOfT0+1_000_000))
				break
			}
		}
	}
	return d
}

// checkAsOf compares the enriched orders with the reference: each order once, with the version
// that held at its created_at, or null; and the reference must test something: orders that carry
// a version older than their customer's latest, and orders of customers with no row yet.
func checkAsOf(t *testing.T, got []map[string]any, d asOfData) {
	t.Helper()
	seen := map[string]int{}
	for _, m := range got {
		id := m["order_id"].(string)
		seen[id]++
		want := d.want[id]
		if want == nil {
			if m["customer"] != nil {
				t.Fatalf("order %s (%v): customer = %v, want null", id, m["created_at"], m["customer"])
			}
			continue
		}
		if !reflect.DeepEqual(normalise(t, m["customer"]), want) {
			t.Fatalf("order %s created at %v: customer = %v, want %v", id, m["created_at"], m["customer"], want)
		}
	}
	if len(got) != len(d.orders) || len(seen) != len(d.orders) {
		t.Fatalf("%d enriched orders, %d distinct, want %d each once", len(got), len(seen), len(d.orders))
	}
	latest := map[string]any{}
	for _, v := range d.versions {
		row := jsonObject(t, v)
		latest[row["customer_id"].(string)] = row["v"]
	}
	older, none := 0, 0
	for _, o := range d.orders {
		order := jsonObject(t, o)
		switch want := d.want[order["order_id"].(string)]; {
		case want == nil:
			none++
		case !reflect.DeepEqual(want["v"], latest[order["customer_id"].(string)]):
			older++
		}
	}
	if older < len(d.orders)/2 || none == 0 {
		t.Fatalf("%d orders carry an older version, %d none: the reference tests too little", older, none)
	}
}

// publishAll writes payloads to a topic in batches of 50, in order.
func publishAll(t *testing.T, c *redis.Client, plan *flow.Plan, topic string, payloads []string) {
	t.Helper()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for from := 0; from < len(payloads); from += 50 {
		var msgs []stages.Message
		for _, p := range payloads[from:min(from+50, len(payloads))] {
			msgs = append(msgs, stages.NewMessage("", []byte(p), nil))
		}
		if err := pub.PublishBatch(context.Background(), topic, msgs); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// consumed waits until group has processed every entry of the topic's partitions.
func consumed(t *testing.T, c *redis.Client, plan *flow.Plan, topic string, partitions int, group string) {
	t.Helper()
	streams := redis.Keys{Prefix: plan.KeyPrefix}.Streams(topic, partitions)
	waitFor(t, "stage "+group+" to process "+topic, func() bool {
		length := int64(0)
		for _, s := range streams {
			st, err := c.StreamStats(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			length += st.Length
			if backlogOf(t, c, s, group) > 0 {
				return false
			}
		}
		return length > 0 // the streams are the topic's: it has entries
	})
}

// TestLookupAsOfIsExactWhateverTheArrivalOrder runs a lookup with as_of as a service and writes the
// same versions and orders in three orders of arrival: every version before any order (each order
// answered at once), every order before any version (each waits in the lookup's state until the
// table's watermark passes it), and the two interleaved by event time, with orders up to 5 s
// ahead of the versions. Each time, each order comes out once with the version that held at its
// created_at.
func TestLookupAsOfIsExactWhateverTheArrivalOrder(t *testing.T) {
	t.Parallel()
	d := newAsOfData(t, 3000, 7)
	arrivals := []struct {
		name    string
		publish func(t *testing.T, c *redis.Client, plan *flow.Plan)
	}{
		{"versions first", func(t *testing.T, c *redis.Client, plan *flow.Plan) {
			publishAll(t, c, plan, "customers", d.versions)
			consumed(t, c, plan, "customers", 3, "customers.table")
			publishAll(t, c, plan, "orders", d.orders)
		}},
		{"orders first", func(t *testing.T, c *redis.Client, plan *flow.Plan) {
			publishAll(t, c, plan, "orders", d.orders)
			consumed(t, c, plan, "orders", 4, "enriched")
			publishAll(t, c, plan, "customers", d.versions)
		}},
		{"interleaved", func(t *testing.T, c *redis.Client, plan *flow.Plan) {
			orders := append([]string(nil), d.orders...)
			created := func(o string) int64 { n, _ := jsonObject(t, o)["created_at"].(float64); return int64(n) }
			sort.SliceStable(orders, func(i, j int) bool { return created(orders[i]) < created(orders[j]) })
			next := 0
			for from := 0; from < len(d.versions); from += 50 {
				until := asOfT0 + int64(from+50)*100 + 5000
				var batch []string
				for ; next < len(orders) && created(orders[next]) < until; next++ {
					batch = append(batch, orders[next])
				}
				publishAll(t, c, plan, "orders", batch)
				publishAll(t, c, plan, "customers", d.versions[from:from+50])
			}
			publishAll(t, c, plan, "orders", orders[next:])
		}},
	}
	for _, b := range []backend{server, cluster} {
		for _, a := range arrivals {
			t.Run(b.name+"/"+a.name, func(t *testing.T) {
				c := b.open(t)
				prefix := fmt.Sprintf("asof-%d", prefixes.Add(1))
				out := prefix + ":out"
				plan := buildSource(t, asOfPipeline(prefix, "effectively_once"), "out="+out)
				svc := startService(t, c, plan, runtime.Options{})
				waitFor(t, "the table to catch up", func() bool {
					return strings.Contains(svc.log.String(), "the table has caught up with its topic")
				})
				a.publish(t, c, plan)
				publishAll(t, c, plan, "customers", d.sentinels)
				waitFor(t, "every order to be enriched", func() bool { return len(streamPayloads(t, c, out)) >= len(d.orders) })
				svc.stop()
				checkAsOf(t, streamPayloads(t, c, out), d)
			})
		}
	}
}

// TestLookupAsOfExactlyOnceThroughKillCycles runs the lookup with as_of and effectively-once
// delivery in flowrun processes killed mid-stream, over and over (orders waiting in the lookup's
// state, versions half applied), then to the end as a job: every order comes out exactly once,
// with the version that held at its created_at. 6,000 orders and 20 cycles; 50,000 and 50 with
// -soak (make soak).
func TestLookupAsOfExactlyOnceThroughKillCycles(t *testing.T) {
	t.Parallel()
	orders, cycles := 6000, 20
	if *soakFlag {
		orders, cycles = 50_000, 50
	}
	d := newAsOfData(t, orders, 11)
	bin := flowrunBinary(t)
	for _, b := range processBackends {
		t.Run(b.name, func(t *testing.T) {
			urls := b.urls(t)
			c := openURLs(t, urls...)
			prefix := fmt.Sprintf("killasof-%d", prefixes.Add(1))
			out := prefix + ":out"
			path := filepath.Join(t.TempDir(), "asof.hcl")
			writeFile(t, path, asOfPipeline(prefix, "effectively_once"))
			plan, _, diags := flow.Build(path, flow.Options{Vars: []string{"out=" + out}})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			// Orders first: they wait in the lookup's state while the versions come, and the kills
			// fall among answers, waiting orders and versions being applied.
			publishAll(t, c, plan, "orders", d.orders)
			publishAll(t, c, plan, "customers", d.versions)
			publishAll(t, c, plan, "customers", d.sentinels)
			keys := redis.Keys{Prefix: prefix}
			orderStreams, customerStreams := keys.Streams("orders", 4), keys.Streams("customers", 3)
			// Small batches: many commits, so that the kills fall among them.
			args := append([]string{"run", path, "--var", "out=" + out, "--lease-ttl", "300ms", "--batch-size", "50"}, redisArgs(urls)...)
			outLen := func() int {
				n, err := c.StreamStats(context.Background(), out)
				if err != nil {
					t.Fatal(err)
				}
				return int(n.Length)
			}
			// Work done: orders answered, and versions the table has applied.
			total := len(d.orders) + len(d.versions) + len(d.sentinels)
			work := func() int {
				n := outLen() + len(d.versions) + len(d.sentinels)
				for _, s := range customerStreams {
					n -= int(backlogOf(t, c, s, "customers.table"))
				}
				return n
			}
			var logs []string
			midBatch, cycle := 0, 0
			for ; cycle < cycles && work() < total-300; cycle++ {
				// The kill point: a random amount more work done, polled without pause. No entry is
				// killed in flight more than twice: a third would make it a poison message.
				target := work() + 20 + rand.IntN(max(100, total/(4*cycles)))
				p := startBinary(t, bin, args...)
				for deadline := time.Now().Add(2 * time.Minute); work() < target || mostDelivered(t, c, "enriched", orderStreams...) > 2 ||
					mostDelivered(t, c, "customers.table", customerStreams...) > 2; {
					if time.Now().After(deadline) {
						t.Fatalf("cycle %d: the work done did not reach %d in two minutes", cycle, target)
					}
				}
				p.kill(t)
				if pendingFor(t, c, keys, "orders", 4, "enriched", "") > 0 || pendingFor(t, c, keys, "customers", 3, "customers.table", "") > 0 {
					midBatch++
				}
				logs = append(logs, p.log.String())
			}
			last := startBinary(t, bin, append(args, "--until-drained")...)
			if err := waitProcess(t, last); err != nil {
				t.Fatalf("the last process, run as a job to the end: %v\n%s", err, last.log.String())
			}
			if got := streamPayloads(t, c, out); len(got) != len(d.orders) {
				t.Logf("the processes' logs:\n%s", strings.Join(append(logs, last.log.String()), "\n----\n"))
			}
			checkAsOf(t, streamPayloads(t, c, out), d)
			if cycle < 3 || midBatch == 0 {
				t.Errorf("%d SIGKILL cycles, %d with batches in flight: too few to test anything", cycle, midBatch)
			}
			t.Logf("%d SIGKILL cycles, %d with batches in flight, %d leases lost", cycle, midBatch, leaseLosses(append(logs, last.log.String())...))
		})
	}
}

// TestTableHistoryIsTrimmed writes 60 versions of one customer, a second apart, to a table with
// history = "10s", then one late version, and looks orders up as of times before, at and after
// the point the history was trimmed to. The table keeps the versions that began at or after the
// watermark less history, the one before that (which still held there), and the late version;
// an order as of a trimmed time gets null, as no kept version had begun; the late version is
// counted late and is there for the lookups after it.
func TestTableHistoryIsTrimmed(t *testing.T) {
	c := server.open(t)
	prefix := fmt.Sprintf("history-%d", prefixes.Add(1))
	out := prefix + ":out"
	src := strings.Replace(asOfPipeline(prefix, "at_least_once"), `history    = "1000h"`, `history    = "10s"`, 1)
	plan := buildSource(t, src, "out="+out)
	var versions []string
	for i := range 60 {
		versions = append(versions, fmt.Sprintf(`{"customer_id":"c0","updated_at":%d,"v":%d}`, asOfT0+int64(i)*1000, i))
	}
	versions = append(versions, fmt.Sprintf(`{"customer_id":"c0","updated_at":%d,"v":"late"}`, asOfT0+55_500))
	publishAll(t, c, plan, "customers", versions)
	// The version each order must carry: as of 30.5 s, trimmed away (the history kept starts at
	// 49 s, the watermark of 59 s less 10 s); 49.5 s, the version that held at the trim point;
	// 55.7 s, the late version; 70 s, after every version, the latest.
	want := map[int64]any{30_500: nil, 49_500: "49", 50_500: "50", 55_700: "late", 70_000: "59"}
	var orders []string
	for at := range want {
		orders = append(orders, fmt.Sprintf(`{"order_id":"o%d","customer_id":"c0","created_at":%d}`, at, asOfT0+at))
	}
	publishAll(t, c, plan, "orders", orders)
	j := runJob(t, c, plan, runtime.Options{})

	entry, found, err := c.ReadState(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.State("customers", redis.Partition("c0", 3), "customers.table"), "c0")
	if err != nil || !found {
		t.Fatalf("the state of c0: %v, %v", found, err)
	}
	var entries [][2]json.RawMessage
	if err := json.Unmarshal(entry, &entries); err != nil {
		t.Fatalf("the state of c0 is %s: %v", entry, err)
	}
	var kept []any
	for _, v := range entries {
		kept = append(kept, fmt.Sprint(jsonObject(t, string(v[1]))["v"]))
	}
	wantKept := []any{"49", "50", "51", "52", "53", "54", "55", "late", "56", "57", "58", "59"}
	if fmt.Sprint(kept) != fmt.Sprint(wantKept) {
		t.Errorf("the versions kept of c0 are %v, want %v", kept, wantKept)
	}
	if s := j.node(t, "customers.table"); s.Late != 1 {
		t.Errorf("the table counted %d late versions, want 1", s.Late)
	}
	got := streamPayloads(t, c, out)
	if len(got) != len(want) {
		t.Fatalf("%d orders out, want %d", len(got), len(want))
	}
	for _, m := range got {
		var at int64
		if _, err := fmt.Sscanf(m["order_id"].(string), "o%d", &at); err != nil {
			t.Fatalf("order %v: %v", m["order_id"], err)
		}
		var v any
		if row, ok := m["customer"].(map[string]any); ok {
			v = fmt.Sprint(row["v"])
		}
		if v != want[at] {
			t.Errorf("the order as of %d ms carries version %v, want %v", at, v, want[at])
		}
	}
}

// TestLookupAsOfDeadLettersWhatItCannotAnswer runs the lookup with as_of and missing =
// "dead_letter", with orders written before the table's versions, so that every order waits in
// the lookup's state and is answered when its timer fires: an order whose customer had no row at
// its created_at is dead-lettered then, with the reason, and so is one without a customer_id (its
// key fails); every other order comes out once with its version, and the counters add up, the
// dead letters counted as absorbed (where the orders were when they came).
func TestLookupAsOfDeadLettersWhatItCannotAnswer(t *testing.T) {
	t.Parallel()
	d := newAsOfData(t, 600, 11)
	bad := []string{`{"order_id":"nokey1","created_at":1700000050000}`, `{"order_id":"nokey2","created_at":1700000060000}`}
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			prefix := fmt.Sprintf("asofdl-%d", prefixes.Add(1))
			out := prefix + ":out"
			src := strings.Replace(asOfPipeline(prefix, "effectively_once"), `as_of = msg.created_at`,
				"as_of = msg.created_at\n  missing = \"dead_letter\"", 1)
			plan := buildSource(t, src, "out="+out)
			svc := startService(t, c, plan, runtime.Options{})
			waitFor(t, "the table to catch up", func() bool {
				return strings.Contains(svc.log.String(), "the table has caught up with its topic")
			})
			publishAll(t, c, plan, "orders", append(append([]string(nil), d.orders...), bad...))
			consumed(t, c, plan, "orders", 4, "enriched")
			publishAll(t, c, plan, "customers", d.versions)
			publishAll(t, c, plan, "customers", d.sentinels)
			answered := 0
			for _, row := range d.want {
				if row != nil {
					answered++
				}
			}
			dl, err := admin.OpenDeadLetters(c, plan, "enriched")
			if err != nil {
				t.Fatal(err)
			}
			var letters []runtime.DeadLetter
			waitFor(t, "every order answered or dead-lettered", func() bool {
				if letters, err = dl.List(context.Background()); err != nil {
					t.Fatal(err)
				}
				return len(streamPayloads(t, c, out)) >= answered && len(letters) >= len(d.orders)-answered+len(bad)
			})
			svc.stop()

			got := streamPayloads(t, c, out)
			seen := map[string]bool{}
			for _, m := range got {
				id := m["order_id"].(string)
				if seen[id] || d.want[id] == nil || !reflect.DeepEqual(normalise(t, m["customer"]), d.want[id]) {
					t.Fatalf("order %s came out with customer %v (again: %v), want %v once", id, m["customer"], seen[id], d.want[id])
				}
				seen[id] = true
			}
			reasons := map[string]string{}
			for _, l := range letters {
				var order map[string]any
				if err := json.Unmarshal(l.Envelope.Payload, &order); err != nil {
					t.Fatalf("dead letter %s: payload %s: %v", l.ID, l.Envelope.Payload, err)
				}
				id := order["order_id"].(string)
				if _, twice := reasons[id]; twice {
					t.Fatalf("order %s dead-lettered twice", id)
				}
				reasons[id] = l.Envelope.Error
			}
			for id, row := range d.want {
				if want := fmt.Sprintf("table customers has no row of key %q", jsonObject(t, orderOf(d, id))["customer_id"]); row == nil && reasons[id] != want {
					t.Errorf("order %s: dead letter %q, want %q", id, reasons[id], want)
				}
			}
			for _, id := range []string{"nokey1", "nokey2"} {
				if !strings.Contains(reasons[id], "customer_id") {
					t.Errorf("order %s without a customer_id: dead letter %q, want one naming msg.customer_id", id, reasons[id])
				}
			}
			if len(reasons) != len(d.orders)-answered+len(bad) || len(got) != answered {
				t.Errorf("%d dead letters and %d orders out, want %d and %d", len(reasons), len(got), len(d.orders)-answered+len(bad), answered)
			}
			if s := summaryNode(&runtime.Summary{Nodes: svc.rt.Snapshot().Nodes}, "enriched"); s.In != int64(len(d.orders)+len(bad)) || s.Absorbed != s.In || s.DeadLettered != 0 {
				t.Errorf("enriched's counters: %+v, want every order in and absorbed, none counted dead-lettered", s)
			}
		})
	}
}

// orderOf returns the payload of the order with that id.
func orderOf(d asOfData, id string) string {
	for _, o := range d.orders {
		if strings.Contains(o, fmt.Sprintf(`"order_id":%q`, id)) {
			return o
		}
	}
	return ""
}

// TestAnEmptyTablePartitionDoesNotHoldLookupsBack: a table of three partitions of which one never
// has an update. Once it has been quiet for the table's idle_timeout it has no say in the table's
// watermark, and every order of a lookup as_of is answered with its version; before, lookups
// waited for it until a job's end.
func TestAnEmptyTablePartitionDoesNotHoldLookupsBack(t *testing.T) {
	c := server.open(t)
	prefix := fmt.Sprintf("asofempty-%d", prefixes.Add(1))
	out := prefix + ":out"
	src := strings.Replace(asOfPipeline(prefix, "effectively_once"), `event_time = msg.updated_at`,
		"event_time   = msg.updated_at\n  idle_timeout = \"1s\"", 1)
	plan := buildSource(t, src, "out="+out)
	var customers []string // of partitions 0 and 1 of the table's topic, none of partition 2
	for i := 0; len(customers) < 10; i++ {
		if key := fmt.Sprintf("c%d", i); redis.Partition(key, 3) != 2 {
			customers = append(customers, key)
		}
	}
	var versions, orders []string
	want := map[string]int64{} // order -> the v it must carry
	for i, cust := range customers {
		versions = append(versions, fmt.Sprintf(`{"customer_id":%q,"updated_at":%d,"v":%d}`, cust, asOfT0+int64(i), i))
		// Far later than any order: moves the watermark of partitions 0 and 1 past them all.
		versions = append(versions, fmt.Sprintf(`{"customer_id":%q,"updated_at":%d,"v":%d}`, cust, asOfT0+1_000_000, 100+i))
	}
	for i := range 200 {
		cust := i % len(customers)
		orders = append(orders, fmt.Sprintf(`{"order_id":"o%d","customer_id":%q,"created_at":%d}`, i, customers[cust], asOfT0+1000+int64(i)))
		want[fmt.Sprintf("o%d", i)] = int64(cust)
	}
	svc := startService(t, c, plan, runtime.Options{})
	waitFor(t, "the table to catch up", func() bool {
		return strings.Contains(svc.log.String(), "the table has caught up with its topic")
	})
	publishAll(t, c, plan, "customers", versions)
	publishAll(t, c, plan, "orders", orders)
	waitFor(t, "every order answered though partition 2 of the table is empty", func() bool {
		return len(streamPayloads(t, c, out)) >= len(orders)
	})
	svc.stop()
	got := streamPayloads(t, c, out)
	for _, m := range got {
		id := m["order_id"].(string)
		if v, _ := m["customer"].(map[string]any)["v"].(float64); int64(v) != want[id] {
			t.Errorf("order %s carries %v, want v = %d", id, m["customer"], want[id])
		}
	}
	if len(got) != len(orders) {
		t.Errorf("%d orders out, want %d", len(got), len(orders))
	}
}
