package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Fault injection: processes killed mid-stream, Redis restarted, connections killed, a lease lost
// between writing a batch's outputs and acking its inputs. Each test publishes numbered messages and
// counts, at the end, which arrived, how often.

// publishNumbered publishes messages from..to-1, keyed over 40 keys, each with its number.
func publishNumbered(t *testing.T, c *redis.Client, plan *flow.Plan, from, to int) {
	t.Helper()
	publishRun(t, c, plan, "", from, to)
}

// publishRun is publishNumbered with the messages of a run (their field run), for the stage
// functions that hold a run's messages (test.gate).
func publishRun(t *testing.T, c *redis.Client, plan *flow.Plan, run string, from, to int) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	extra := ""
	if run != "" {
		extra = fmt.Sprintf(`,"run":%q`, run)
	}
	for i := from; i < to; i++ {
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(fmt.Sprintf(`{"k":"k%d","i":%d%s}`, i%40, i, extra)), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// arrivals counts, per message number, the entries of the output stream.
func arrivals(t *testing.T, c *redis.Client, stream string) map[int]int {
	t.Helper()
	got := map[int]int{}
	after := "0"
	for {
		recs, err := c.Read(context.Background(), stream, after, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return got
		}
		for _, r := range recs {
			got[int(jsonObject(t, string(r.Payload))["i"].(float64))]++
			after = r.ID
		}
	}
}

// tally checks that messages 0..n-1 all arrived and returns how many arrived more than once.
func tally(t *testing.T, got map[int]int, n int) (duplicates int) {
	t.Helper()
	for i := 0; i < n; i++ {
		switch c := got[i]; {
		case c == 0:
			t.Errorf("message %d was lost", i)
		case c > 1:
			duplicates += c - 1
		}
	}
	if len(got) != n {
		t.Errorf("%d distinct messages arrived, want %d", len(got), n)
	}
	return duplicates
}

// killPipeline is testdata/faults.hcl with faults.slow and a topic between the stage and the sink
// whose max_lag keeps the stage's reads small (a stage reads no more than the cap of the topics
// it writes): what a process has in flight when it is killed, and so what at_least_once may
// repeat, is a few hundred entries instead of whole reads of 1000.
func killPipeline(prefix, out, delivery string) string {
	return fmt.Sprintf(`
pipeline "faults" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
topic "mid" {
  partitions = 4
  key        = msg.k
  max_lag    = 100
}
stage "work" {
  kind        = "go"
  func        = "faults.slow"
  input       = topic.in
  concurrency = 4
}
stage "pass" {
  kind   = "filter"
  input  = stage.work
  output = topic.mid
  where  = true
}
sink "out" {
  kind   = "redis_stream"
  input  = topic.mid
  stream = %q
}
`, prefix, delivery, out)
}

// TestKilledProcessRestarts kills a flowrun process with SIGKILL in the middle of its work and starts
// it again: nothing is lost; with effectively_once, and on a single server, nothing arrives twice;
// on a cluster with at_least_once, at most the entries the killed process had in flight. Its two
// stages run fused in one hop, and again (unfused) in a hop each.
func TestKilledProcessRestarts(t *testing.T) {
	t.Parallel()
	// 12000 messages over 4 partitions, 4 at a time each, 2ms apiece: at least 1.5s of work, of
	// which the kill, after the first fifth has arrived, leaves most undone.
	const n = 12000
	bin := buildBinary(t, "./testdata/flowrun-faults")
	for _, b := range []struct {
		name string
		urls func(t *testing.T) []string
	}{
		{"server", func(t *testing.T) []string { return []string{redistest.Shared(t).URL()} }},
		{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t, 3).URLs() }},
	} {
		for _, run := range []struct{ delivery, fusion string }{
			{"at_least_once", "fused"}, {"effectively_once", "fused"}, {"at_least_once", "unfused"}, {"effectively_once", "unfused"},
		} {
			delivery := run.delivery
			t.Run(b.name+"/"+delivery+"/"+run.fusion, func(t *testing.T) {
				urls := b.urls(t)
				c := openURLs(t, urls...)
				prefix := fmt.Sprintf("kill-%d", prefixes.Add(1))
				out := prefix + ":out"
				path := filepath.Join(t.TempDir(), "faults.hcl")
				writeFile(t, path, killPipeline(prefix, out, delivery))
				plan, _, diags := flow.Build(path, flow.Options{GoFuncs: []string{"faults.slow"}})
				if diags.HasErrors() {
					t.Fatal(diags)
				}
				publishNumbered(t, c, plan, 0, n)
				args := []string{"run", path, "--lease-ttl", "1s"}
				if run.fusion == "unfused" {
					args = append(args, "--no-fusion")
				}
				for _, u := range urls {
					args = append(args, "--redis", u)
				}
				first := startBinary(t, bin, args...)
				length := func() int {
					n, err := c.StreamLen(context.Background(), out)
					if err != nil {
						t.Fatal(err)
					}
					return int(n)
				}
				waitFor(t, "a fifth of the messages to arrive", func() bool { return length() >= n/5 })
				first.kill(t)
				atKill := length()
				if atKill >= n {
					t.Fatal("every message had arrived before the kill: nothing was killed mid-stream")
				}
				// What the killed process had read and not acknowledged, in both hops: the only
				// entries the next process can process a second time.
				keys := redis.Keys{Prefix: prefix}
				inFlight := pendingFor(t, c, keys, "in", 4, "work", "") + pendingFor(t, c, keys, "work.out", 4, "pass", "") +
					pendingFor(t, c, keys, "mid", 4, "out", "")

				second := startBinary(t, bin, append(args, "--until-drained")...)
				if err := waitProcess(t, second); err != nil {
					t.Fatalf("the restarted job: %v\n%s", err, second.log.String())
				}
				dups := tally(t, arrivals(t, c, out), n)
				losses := leaseLosses(first.log.String(), second.log.String())
				t.Logf("%s: %d sent, %d arrived before the SIGKILL with %d in flight, %d received, %d duplicated, %d leases lost",
					delivery, n, atKill, inFlight, n+dups, dups, losses)
				// The duplicates allowed: none with effectively_once. With at_least_once, on a single
				// server, none either (a batch's outputs and acks are one transaction) unless a lease
				// was lost, which lets its unit's batch be written twice (at most a read, 1000
				// entries). On a cluster, where outputs go before acks, each entry in flight at the
				// kill may have had its outputs written: at most one duplicate each.
				allowed := losses * redis.DefaultReadCount
				switch {
				case delivery == "effectively_once":
					allowed = 0
				case b.name == "cluster":
					allowed += inFlight
				}
				if dups > allowed {
					t.Errorf("%d duplicates, want at most %d (%s on %s, %d entries in flight at the kill, %d leases lost)",
						dups, allowed, delivery, b.name, inFlight, losses)
				}
				if allowed >= atKill {
					// Not a failure, but the bound would not catch a restart that did everything again.
					t.Logf("note: the bound %d is not below the %d messages that had arrived at the kill", allowed, atKill)
				}
			})
		}
	}
}

// TestRedisRestart restarts redis-server (with AOF, so that it keeps what it acknowledged) while a
// pipeline runs, with a batch held in a stage by a gate: the runtime reconnects, the held batch is
// committed to the restarted server, and every message arrives once (a single server commits a
// batch's outputs and acks in one transaction, and a commit whose reply was lost is not done again).
func TestRedisRestart(t *testing.T) { fusedAndNot(t, testRedisRestart) }

// fusedAndNot runs a test with the pipeline's chains fused, and again with every stage in a hop of
// its own (runtime.Options.NoFusion).
func fusedAndNot(t *testing.T, test func(t *testing.T, noFusion bool)) {
	t.Run("fused", func(t *testing.T) { test(t, false) })
	t.Run("unfused", func(t *testing.T) { test(t, true) })
}

func testRedisRestart(t *testing.T, noFusion bool) {
	const n = 2000
	ctx := context.Background()
	srv := redistest.Start(t, redistest.WithAOF())
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("restart-%d", prefixes.Add(1))
	out := prefix + ":out"
	g := newGate(t, prefix)
	plan := buildTestdata(t, "faults.hcl", "out="+out)
	publishRun(t, c, plan, prefix, 0, n/2)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var log syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := runtime.Run(runCtx, plan, runtime.Options{Redis: c, Logger: newLogger(&log), LeaseTTL: 5 * time.Second, NoFusion: noFusion})
		done <- err
	}()
	g.waitEntered(t)
	waitFor(t, "messages of the other partitions to arrive", func() bool { return len(arrivals(t, c, out)) > 0 })
	srv.Restart(t)
	waitFor(t, "the client to reconnect", func() bool { return c.Universal().Ping(ctx).Err() == nil })
	// Message 0 is still held, with its batch: the restart struck mid-stream.
	if got := arrivals(t, c, out); got[0] > 0 || len(got) >= n/2 {
		t.Fatalf("%d messages, message 0 among them, had arrived at the restart: nothing was in flight", len(got))
	}
	publishRun(t, c, plan, prefix, n/2, n)
	g.release()
	waitFor(t, "every message to arrive after the restart", func() bool { return len(arrivals(t, c, out)) == n })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "Redis is failing") {
		t.Errorf("the runtime did not notice the restart:\n%s", log.String())
	}
	dups := tally(t, arrivals(t, c, out), n)
	losses := leaseLosses(log.String())
	t.Logf("redis restart: %d sent, %d received, %d duplicated, %d leases lost", n, n+dups, dups, losses)
	if dups > losses*redis.DefaultReadCount {
		t.Errorf("%d duplicates on a single server with %d leases lost: want at most %d (a batch per lost lease)",
			dups, losses, losses*redis.DefaultReadCount)
	}
}

// TestConnectionsKilled kills the runtime's connections (CLIENT KILL) again and again while it
// works, first while a gate holds a batch in a stage, then while the rest goes through: it
// reconnects, nothing is lost, and (on a single server, where a commit is one transaction and a
// batch whose reply was lost is read again from the pending entries) nothing arrives twice. Each
// node's counters add up, and count each entry once, though commits failed and were done again or
// were applied while their replies were lost: the sink counts as written what the stream holds.
func TestConnectionsKilled(t *testing.T) { fusedAndNot(t, testConnectionsKilled) }

func testConnectionsKilled(t *testing.T, noFusion bool) {
	const n, heldKills, maxKills = 3000, 3, 20
	srv := redistest.Start(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("clientkill-%d", prefixes.Add(1))
	out := prefix + ":out"
	g := newGate(t, prefix)
	plan := buildTestdata(t, "faults.hcl", "out="+out)
	publishRun(t, c, plan, prefix, 0, n)

	runner := openURLs(t, srv.URL())
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	rt, err := runtime.New(plan, runtime.Options{Redis: runner, Logger: newLogger(&log), BatchSize: 50, NoFusion: noFusion})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := rt.Run(ctx)
		done <- err
	}()
	killer := srv.Client(t)
	kills, midStream := 0, 0
	// kill kills every connection but the killer's (the runtime's and the test's client's, which
	// re-dial), and tells whether there was any.
	kill := func() bool {
		k, err := killer.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Int()
		if err != nil || k == 0 {
			return false
		}
		kills++
		if got := len(arrivals(t, c, out)); got < n {
			midStream++ // checked right after the kill: some messages had not arrived
		}
		return true
	}
	g.waitEntered(t)
	for range heldKills {
		waitFor(t, "connections to kill while message 0 is held", kill)
	}
	if got := arrivals(t, c, out); got[0] > 0 {
		t.Fatal("message 0 arrived while it was held")
	}
	g.release()
	waitFor(t, "every message to arrive while connections are killed", func() bool {
		got := len(arrivals(t, c, out))
		if got < n && kills < maxKills {
			kill()
		}
		return got == n
	})
	// A commit whose reply was lost counts once the worker has read its pending entries again.
	length := func() int64 {
		l, err := c.StreamLen(context.Background(), out)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	var counted map[string]runtime.NodeSummary
	waitFor(t, "the sink to count what it wrote", func() bool {
		counted = map[string]runtime.NodeSummary{}
		for _, s := range rt.Snapshot().Nodes {
			counted[s.Name] = s
		}
		return counted["out"].Written >= length()
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	for name, s := range counted {
		if sum := s.Out + s.Filtered + s.Dropped + s.Absorbed + s.DeadLettered + s.InFlight; sum != s.In || s.InFlight != 0 {
			t.Errorf("%s: in %d, its outcomes %d: %+v", name, s.In, sum, s)
		}
	}
	// What a node wrote, its reader took in, once each: its entries, however often commits failed.
	if w, in := counted["pass"].Written, counted["out"].In; w != in {
		t.Errorf("pass wrote %d entries, out took in %d", w, in)
	}
	if written, l := counted["out"].Written, length(); written != l {
		t.Errorf("the sink counted %d written, its stream holds %d entries", written, l)
	}
	dups := tally(t, arrivals(t, c, out), n)
	losses := leaseLosses(log.String())
	t.Logf("client kill: %d kills, %d of them mid-stream, %d sent, %d received, %d duplicated, %d leases lost",
		kills, midStream, n, n+dups, dups, losses)
	if midStream < heldKills {
		t.Errorf("%d kills struck mid-stream, want at least the %d made while message 0 was held", midStream, heldKills)
	}
	if dups > losses*50 {
		t.Errorf("%d duplicates on a single server with %d leases lost: want at most %d (a batch of 50 per lost lease)",
			dups, losses, losses*50)
	}
}

// gates hold test.gate's messages until a test lets them go.
var gates sync.Map // run name -> chan struct{}

func init() {
	// test.gate blocks the message numbered 0 of a run until the test closes the run's gate, and
	// says it is waiting by sending on the gate's "entered" channel.
	stages.Register("test.gate", func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
		if v, ok := gates.Load(fmt.Sprint(m.Value["run"])); ok && fmt.Sprint(m.Value["i"]) == "0" {
			g := v.(*gate)
			g.once.Do(func() { close(g.entered) })
			select {
			case <-g.open:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
}

type gate struct {
	once, opened  sync.Once
	entered, open chan struct{}
}

// newGate holds the message numbered 0 of a run in test.gate until release; the test's end
// releases it too.
func newGate(t *testing.T, run string) *gate {
	g := &gate{entered: make(chan struct{}), open: make(chan struct{})}
	gates.Store(run, g)
	t.Cleanup(func() {
		g.release()
		gates.Delete(run)
	})
	return g
}

// waitEntered waits until message 0 is held; the deadline only keeps a broken test from hanging.
func (g *gate) waitEntered(t *testing.T) {
	t.Helper()
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case <-g.entered:
	case <-timer.C:
		t.Fatal("message 0 never reached the gate")
	}
}

func (g *gate) release() { g.opened.Do(func() { close(g.open) }) }

// TestLeaseLostBetweenOutputsAndAcks is the crash window of at-least-once delivery, made
// deterministic: a process commits a batch but has lost its lease meanwhile, so its acks are
// refused; the next owner processes the batch again. With at_least_once the outputs were written
// anyway and the batch arrives twice; with effectively_once the commit, one script that checks the
// lease before it writes, wrote nothing, and the batch arrives once.
func TestLeaseLostBetweenOutputsAndAcks(t *testing.T) {
	for _, delivery := range []string{"at_least_once", "effectively_once"} {
		t.Run(delivery, func(t *testing.T) {
			ctx := context.Background()
			c := server.open(t)
			run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1)) // one gate per run, also with -count
			g := newGate(t, run)
			plan := buildSource(t, fmt.Sprintf(`
pipeline "lease" {
  delivery = %q
}
topic "in" {}
topic "out" {}
stage "gate" {
  kind   = "go"
  func   = "test.gate"
  input  = topic.in
  output = topic.out
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
`, delivery))
			pub, err := runtime.NewPublisher(c, plan)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 10; i++ {
				if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(fmt.Sprintf(`{"run":%q,"i":%d}`, run, i)), nil)); err != nil {
					t.Fatal(err)
				}
			}
			if err := pub.Close(ctx); err != nil {
				t.Fatal(err)
			}

			// Process a holds the lease for an hour and reads the batch; message 0 holds it back.
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			leaseKey := keys.Lease("in", 0, "gate")
			aCtx, stopA := context.WithCancel(ctx)
			var logA syncBuffer
			aDone := make(chan error, 1)
			go func() {
				_, err := runtime.Run(aCtx, plan, runtime.Options{Redis: c, Nodes: []string{"gate"}, ProcessID: "a",
					LeaseTTL: time.Hour, Logger: newLogger(&logA)})
				aDone <- err
			}()
			g.waitEntered(t)
			// Meanwhile its lease expires and someone else takes it.
			rdb := c.Universal()
			if err := rdb.Del(ctx, leaseKey).Err(); err != nil {
				t.Fatal(err)
			}
			thief, ok, err := c.AcquireLease(ctx, leaseKey, "thief", time.Hour)
			if err != nil || !ok {
				t.Fatalf("taking the lease: %v, %v", ok, err)
			}
			g.release()
			waitFor(t, "process a to find its lease lost", func() bool {
				return strings.Contains(logA.String(), "lost the partition to another process")
			})
			stopA()
			if err := <-aDone; err != nil {
				t.Fatal(err)
			}
			outStream := keys.Stream("out", 0)
			wrote := int64(10)
			if delivery == "effectively_once" {
				wrote = 0
			}
			if n, _ := rdb.XLen(ctx, outStream).Result(); n != wrote {
				t.Fatalf("process a wrote %d outputs, want %d", n, wrote)
			}
			if pendingN, _ := rdb.XPending(ctx, keys.Stream("in", 0), "gate").Result(); pendingN.Count != 10 {
				t.Fatalf("%d entries pending, want the 10 whose acks were refused", pendingN.Count)
			}

			// The lease is free again; process b takes the partition over and processes the batch again.
			if err := c.ReleaseLease(ctx, thief); err != nil {
				t.Fatal(err)
			}
			runJob(t, c, plan, runtime.Options{Nodes: []string{"gate"}, ProcessID: "b"})
			got := map[int]int{}
			msgs, err := rdb.XRange(ctx, outStream, "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				got[int(jsonObject(t, m.Values["payload"].(string))["i"].(float64))]++
			}
			dups := tally(t, got, 10)
			t.Logf("%s: 10 sent, %d received downstream, %d duplicated", delivery, 10+dups, dups)
			switch {
			case delivery == "at_least_once" && dups != 10:
				t.Errorf("%d duplicates, want the whole batch again", dups)
			case delivery == "effectively_once" && dups != 0:
				t.Errorf("%d duplicates with effectively_once", dups)
			}
		})
	}
}
