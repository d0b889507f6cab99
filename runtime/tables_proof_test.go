package runtime_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The proof of lookups at processing time (issue 23): orders looked up in a customers table that
// changes while they are looked up, exact against what the test wrote, on the embedded Redis, a
// redis-server and the 3-master cluster, and through SIGKILLs with effectively-once delivery.
//
// A lookup sees an update once the table's stage has committed it, and nobody can say when the
// lookup of an order runs, so the test makes the answer certain by construction. The customers are
// in groups, the orders come in rounds, and each round's orders are of one group's customers.
// While a round's orders are looked up, the test updates, deletes and writes again the customers
// of the next round's group, which no order in flight names; before it writes the next round's
// orders it waits until the table's stage has committed every update (as Redis says: its group
// has delivered and acknowledged the end of each partition) and this round's orders are out. So
// each order must carry its customer's row as the test's writes left it when the order was
// written, or null, while updates of other customers are applied around it. (The generated
// pipelines, internal/modeltest, cover lookups after a table written whole before the run.)

// lookupScale is how big a proof is: customers c0..c{customers-1} have rows (some deleted on the
// way), orders name c0..c{referenced-1}, customer i is in group i % groups, and rounds rounds of
// perRound orders are written.
type lookupScale struct {
	customers, referenced, groups, rounds, perRound int
}

// The scale of make test, and that of make soak (-soak): 50,000 orders.
var (
	lookupTestScale = lookupScale{customers: 200, referenced: 220, groups: 4, rounds: 6, perRound: 250}
	lookupSoakScale = lookupScale{customers: 2000, referenced: 2200, groups: 4, rounds: 50, perRound: 1000}
)

func lookupProofScale() lookupScale {
	if *soakFlag {
		return lookupSoakScale
	}
	return lookupTestScale
}

// lookupProof writes the customers and orders of a proof and keeps what each order must carry.
type lookupProof struct {
	lookupScale
	plan    *flow.Plan
	rows    map[string]map[string]any // the table as the test's writes make it; deleted customers absent
	version map[int]int               // each customer's last version written
	want    map[string]map[string]any // by order id: its customer's row when it was written; nil: none
	orders  int                       // written so far
	// What the orders met, for the check that the proof proves something.
	updated, deleted, unknown int
}

func newLookupProof(s lookupScale, plan *flow.Plan) *lookupProof {
	return &lookupProof{lookupScale: s, plan: plan, rows: map[string]map[string]any{}, version: map[int]int{},
		want: map[string]map[string]any{}}
}

// writeTable writes version 1 of every customer: the table the lookup catches up with.
func (p *lookupProof) writeTable(t *testing.T, c *redis.Client) {
	t.Helper()
	p.publish(t, c, func(pub *runtime.Publisher) {
		for i := range p.customers {
			p.put(t, pub, i)
		}
	})
}

// round writes round r: the updates of the next round's group, then the orders of this one's
// (group r % groups), so that the updates are applied while the orders are looked up.
func (p *lookupProof) round(t *testing.T, c *redis.Client, r int) {
	t.Helper()
	group := r % p.groups
	var named []int
	for i := group; i < p.referenced; i += p.groups {
		named = append(named, i)
	}
	msgs := make([]stages.Message, 0, p.perRound)
	for range p.perRound {
		n := p.orders
		p.orders++
		i := named[n%len(named)]
		id, customer := fmt.Sprintf("o%d", n), fmt.Sprintf("c%d", i)
		row, ok := p.rows[customer]
		switch {
		case !ok && i >= p.customers:
			p.unknown++
		case !ok:
			p.deleted++
		case p.version[i] > 1:
			p.updated++
		}
		p.want[id] = row
		msgs = append(msgs, stages.NewMessage("", fmt.Appendf(nil, `{"order_id":%q,"customer_id":%q,"n":%d}`, id, customer, n), nil))
	}
	next := (r + 1) % p.groups
	p.publish(t, c, func(pub *runtime.Publisher) {
		for i := next; i < p.customers; i += p.groups {
			// Each round a customer changes: every seventh (a different one each time) is deleted,
			// and a deleted one written again.
			if _, ok := p.rows[fmt.Sprintf("c%d", i)]; ok && (i/p.groups+r)%7 == 0 {
				p.remove(t, pub, i)
			} else {
				p.put(t, pub, i)
			}
		}
	})
	p.publish(t, c, func(pub *runtime.Publisher) {
		if err := pub.PublishBatch(context.Background(), "orders", msgs); err != nil {
			t.Fatal(err)
		}
	})
}

// put writes customer i's next version.
func (p *lookupProof) put(t *testing.T, pub *runtime.Publisher, i int) {
	t.Helper()
	p.version[i]++
	row := customerRow(i, p.version[i])
	if err := pub.Publish(context.Background(), "customers", stages.NewMessage("", []byte(row), nil)); err != nil {
		t.Fatal(err)
	}
	p.rows[fmt.Sprintf("c%d", i)] = jsonObject(t, row)
}

// remove deletes customer i: a null payload with its key.
func (p *lookupProof) remove(t *testing.T, pub *runtime.Publisher, i int) {
	t.Helper()
	key := fmt.Sprintf("c%d", i)
	if err := pub.Publish(context.Background(), "customers", stages.NewMessage(key, []byte("null"), nil)); err != nil {
		t.Fatal(err)
	}
	delete(p.rows, key)
}

// publish writes with a publisher of its own, and returns once Redis has everything.
func (p *lookupProof) publish(t *testing.T, c *redis.Client, write func(*runtime.Publisher)) {
	t.Helper()
	pub, err := runtime.NewPublisher(c, p.plan)
	if err != nil {
		t.Fatal(err)
	}
	write(pub)
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// settled reports whether the table's stage has committed everything written to the customers
// topic and every order written is out: the next round may start.
func (p *lookupProof) settled(t *testing.T, c *redis.Client, out string) bool {
	t.Helper()
	ctx := context.Background()
	n, err := c.Universal().XLen(ctx, out).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n < int64(p.orders) {
		return false
	}
	streams := redis.Keys{Prefix: p.plan.KeyPrefix}.Streams("customers", 3)
	ends, err := c.LastIDs(ctx, streams)
	if err != nil {
		t.Fatal(err)
	}
	progress, err := c.GroupsProgress(ctx, streams, "customers.table")
	if err != nil {
		t.Fatal(err)
	}
	for i := range streams {
		if !progress[i].Committed(ends[i]) {
			return false
		}
	}
	return true
}

// check compares the enriched orders with what each must carry: every order once, with its
// customer's row as it was when the order was written, or null.
func (p *lookupProof) check(t *testing.T, got []map[string]any) {
	t.Helper()
	seen := map[string]int{}
	wrong := 0
	for _, m := range got {
		id := fmt.Sprint(m["order_id"])
		seen[id]++
		want, known := p.want[id]
		if !known {
			t.Fatalf("an order the test did not write: %v", m)
		}
		var have map[string]any
		if m["customer"] != nil {
			have = normalise(t, m["customer"]).(map[string]any)
		}
		if !reflect.DeepEqual(have, want) {
			if wrong++; wrong <= 10 {
				t.Errorf("order %s of %s: customer = %v, want %v", id, m["customer_id"], m["customer"], want)
			}
		}
	}
	lost, repeated := 0, 0
	for id := range p.want {
		switch n := seen[id]; {
		case n == 0:
			lost++
		case n > 1:
			repeated++
		}
	}
	if wrong+lost+repeated > 0 {
		t.Fatalf("of %d orders, %d carry another row than they must, %d are lost and %d came more than once", p.orders, wrong, lost, repeated)
	}
	if p.updated == 0 || p.deleted == 0 || p.unknown == 0 {
		t.Fatalf("orders of updated customers %d, of deleted ones %d, of unknown ones %d: the proof misses a case", p.updated, p.deleted, p.unknown)
	}
	t.Logf("%d orders exact: %d of updated customers, %d of deleted ones, %d of unknown ones", p.orders, p.updated, p.deleted, p.unknown)
}

// TestLookupAtProcessingTimeIsExact runs the proof in this process as a service, on every backend:
// 1,500 orders in 6 rounds (50,000 in 50 rounds of 1,000 against 2,000 customers with -soak).
func TestLookupAtProcessingTimeIsExact(t *testing.T) {
	t.Parallel()
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := fmt.Sprintf("lookup-proof-%d", prefixes.Add(1))
			plan := buildSource(t, lookupPipeline("", "msg.customer_id", "", "at_least_once"), "out="+out)
			p := newLookupProof(lookupProofScale(), plan)
			p.writeTable(t, c)
			opts := runtime.Options{}
			if b.name == "embedded" {
				opts.Block = 20 * time.Millisecond // the embedded Redis cannot wake blocked reads
			}
			svc := startService(t, c, plan, opts)
			start := time.Now()
			for r := range p.rounds {
				p.round(t, c, r)
				waitFor(t, fmt.Sprintf("round %d to be looked up and the next round's updates committed", r), func() bool { return p.settled(t, c, out) })
			}
			took := time.Since(start)
			svc.stop()
			p.check(t, streamPayloads(t, c, out))
			t.Logf("%d rounds in %s", p.rounds, took.Round(time.Millisecond))
		})
	}
}

// TestLookupAtProcessingTimeThroughKills runs the proof in flowrun processes with effectively-once
// delivery, killing the process with SIGKILL once in every round, once it has looked up a random
// number of the round's orders (at most a quarter of them), and starting another: the next takes
// the partitions over when the killed one's leases expire, catches the table up again and goes on. Every order must come out
// exactly once, with its row. 6 kills on each backend; 50 with -soak (a round each).
func TestLookupAtProcessingTimeThroughKills(t *testing.T) {
	t.Parallel()
	bin := flowrunBinary(t)
	for _, b := range processBackends {
		t.Run(b.name, func(t *testing.T) {
			urls := b.urls(t)
			c := openURLs(t, urls...)
			prefix := fmt.Sprintf("killproof-%d", prefixes.Add(1))
			out := prefix + ":out"
			path := filepath.Join(t.TempDir(), "lookups.hcl")
			writeFile(t, path, lookupPipeline(prefix, "msg.customer_id", "", "effectively_once"))
			plan, _, diags := flow.Build(path, flow.Options{Vars: []string{"out=" + out}})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			p := newLookupProof(lookupProofScale(), plan)
			p.writeTable(t, c)
			inputs := redis.Keys{Prefix: prefix}.Streams("orders", 4)
			backlog := func() int {
				n := 0
				for _, s := range inputs {
					n += int(backlogOf(t, c, s, "enriched"))
				}
				return n
			}
			outLen := func() int {
				n, err := c.Universal().XLen(context.Background(), out).Result()
				if err != nil {
					t.Fatal(err)
				}
				return int(n)
			}
			// Small batches, so that a kill finds some in flight: a round's orders are many of them.
			args := append([]string{"run", path, "--var", "out=" + out, "--lease-ttl", "300ms", "--batch-size", "16"}, redisArgs(urls)...)
			proc := startBinary(t, bin, args...)
			var logs []string
			midBatch, midRound := 0, 0 // kills with batches in flight, with orders left to look up
			start := time.Now()
			for r := range p.rounds {
				p.round(t, c, r)
				// The kill point: once a random number of the round's orders (at most a quarter) is
				// out, polled without pause on one key, as a process takes milliseconds over a round.
				// (An order is delivered twice at most, the round settling between kills: no poison.)
				progress := 1 + rand.IntN(p.perRound/4)
				for deadline := time.Now().Add(time.Minute); outLen() < p.orders-p.perRound+progress; {
					if time.Now().After(deadline) {
						t.Fatalf("round %d: %d orders not looked up in a minute", r, progress)
					}
				}
				proc.kill(t)
				keys := redis.Keys{Prefix: prefix}
				if pendingFor(t, c, keys, "orders", 4, "enriched", "")+pendingFor(t, c, keys, "customers", 3, "customers.table", "") > 0 {
					midBatch++
				}
				if backlog() > 0 {
					midRound++
				}
				logs = append(logs, proc.log.String())
				proc = startBinary(t, bin, args...)
				waitFor(t, fmt.Sprintf("round %d to be looked up and the next round's updates committed", r), func() bool { return p.settled(t, c, out) })
			}
			took := time.Since(start)
			proc.kill(t)
			p.check(t, streamPayloads(t, c, out))
			if midBatch == 0 {
				t.Errorf("%d SIGKILLs, none with a batch in flight: the proof tests no crash", p.rounds)
			}
			t.Logf("%d SIGKILLs, %d with orders left to look up, %d with batches in flight, %d leases lost, in %s",
				p.rounds, midRound, midBatch, leaseLosses(logs...), took.Round(time.Millisecond))
		})
	}
}
