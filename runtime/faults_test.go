package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// faultPipeline reads keyed messages through a stage into a stream that other applications read.
func faultPipeline(prefix, stage, out, delivery string) string {
	return fmt.Sprintf(`
pipeline "faults" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
stage "work" {
  %s
  input       = topic.in
  concurrency = 4
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.work
  stream = %q
}
`, prefix, delivery, stage, out)
}

// publishNumbered publishes messages from..to-1, keyed over 40 keys, each with its number.
func publishNumbered(t *testing.T, c *redis.Client, plan *flow.Plan, from, to int) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(fmt.Sprintf(`{"k":"k%d","i":%d}`, i%40, i)), nil)); err != nil {
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

// TestKilledProcessRestarts kills a flowrun process with SIGKILL in the middle of its work and starts
// it again: nothing is lost, and with effectively_once nothing arrives twice.
func TestKilledProcessRestarts(t *testing.T) {
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
		for _, delivery := range []string{"at_least_once", "effectively_once"} {
			t.Run(b.name+"/"+delivery, func(t *testing.T) {
				urls := b.urls(t)
				c := openURLs(t, urls...)
				prefix := fmt.Sprintf("kill-%d", prefixes.Add(1))
				out := prefix + ":out"
				path := filepath.Join(t.TempDir(), "faults.hcl")
				writeFile(t, path, faultPipeline(prefix, `kind = "go"
  func = "faults.slow"`, out, delivery))
				plan, _, diags := flow.Build(path, flow.Options{GoFuncs: []string{"faults.slow"}})
				if diags.HasErrors() {
					t.Fatal(diags)
				}
				publishNumbered(t, c, plan, 0, n)
				args := []string{"run", path, "--lease-ttl", "1s"}
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
				if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				_ = first.cmd.Wait()
				atKill := length()
				if atKill >= n {
					t.Fatal("every message had arrived before the kill: nothing was killed mid-stream")
				}

				second := startBinary(t, bin, append(args, "--until-drained")...)
				if err := second.cmd.Wait(); err != nil {
					t.Fatalf("the restarted job: %v\n%s", err, second.log.String())
				}
				dups := tally(t, arrivals(t, c, out), n)
				t.Logf("%s: %d sent, %d arrived before the SIGKILL, %d received, %d duplicated, 0 dead-lettered",
					delivery, n, atKill, n+dups, dups)
				if delivery == "effectively_once" && dups > 0 {
					t.Errorf("%d duplicates with effectively_once", dups)
				}
			})
		}
	}
}

// TestRedisRestart restarts redis-server (with AOF, so that it keeps what it acknowledged) while a
// pipeline runs: the runtime reconnects and nothing is lost.
func TestRedisRestart(t *testing.T) {
	const n = 2000
	srv := redistest.Start(t, redistest.WithAOF())
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("restart-%d", prefixes.Add(1))
	out := prefix + ":out"
	plan := buildSource(t, faultPipeline(prefix, `kind = "map"
  set  = { seen = true }`, out, "at_least_once"))
	publishNumbered(t, c, plan, 0, n/2)

	ctx, stop := context.WithCancel(context.Background())
	var log syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log), LeaseTTL: 5 * time.Second})
		done <- err
	}()
	waitFor(t, "some messages to arrive", func() bool { return len(arrivals(t, c, out)) > 0 })
	srv.Restart(t)
	publishNumbered(t, c, plan, n/2, n)
	waitFor(t, "every message to arrive after the restart", func() bool { return len(arrivals(t, c, out)) == n })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	dups := tally(t, arrivals(t, c, out), n)
	t.Logf("redis restart: %d sent, %d received, %d duplicated", n, n+dups, dups)
}

// TestConnectionsKilled kills the runtime's connections (CLIENT KILL) again and again while it
// works: it reconnects and nothing is lost.
func TestConnectionsKilled(t *testing.T) {
	const n = 3000
	srv := redistest.Start(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("clientkill-%d", prefixes.Add(1))
	out := prefix + ":out"
	plan := buildSource(t, faultPipeline(prefix, `kind = "map"
  set  = { seen = true }`, out, "at_least_once"))
	publishNumbered(t, c, plan, 0, n)

	runner := openURLs(t, srv.URL())
	ctx, stop := context.WithCancel(context.Background())
	var log syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: runner, Logger: newLogger(&log), BatchSize: 50})
		done <- err
	}()
	killer := srv.Client(t)
	kills := 0
	deadline := time.Now().Add(20 * time.Second)
	waitFor(t, "every message to arrive while connections are killed", func() bool {
		got := len(arrivals(t, c, out))
		if time.Now().After(deadline) {
			t.Fatalf("stuck at %d of %d after %d kills\n%s", got, n, kills, log.String())
		}
		if got < n && kills < 20 {
			// Kill every connection of the runtime's client (named flowrun), sparing the test's.
			if k, err := killer.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Int(); err == nil && k > 0 {
				kills++
			}
		}
		return got == n
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	dups := tally(t, arrivals(t, c, out), n)
	t.Logf("client kill: %d kills, %d sent, %d received, %d duplicated", kills, n, n+dups, dups)
	if kills == 0 {
		t.Error("no connection was killed: the test did not test anything")
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
	})
}

type gate struct {
	once          sync.Once
	entered, open chan struct{}
}

// TestLeaseLostBetweenOutputsAndAcks is the crash window of at-least-once delivery, made
// deterministic: a process writes a batch's outputs but has lost its lease meanwhile, so its acks
// are refused; the next owner processes the batch again. With at_least_once the batch arrives twice;
// with effectively_once the second writes are recognised and dropped.
func TestLeaseLostBetweenOutputsAndAcks(t *testing.T) {
	for _, delivery := range []string{"at_least_once", "effectively_once"} {
		t.Run(delivery, func(t *testing.T) {
			ctx := context.Background()
			c := server.open(t)
			run := t.Name()
			g := &gate{entered: make(chan struct{}), open: make(chan struct{})}
			gates.Store(run, g)
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
			<-g.entered
			// Meanwhile its lease expires and someone else takes it.
			rdb := c.Universal()
			if err := rdb.Del(ctx, leaseKey).Err(); err != nil {
				t.Fatal(err)
			}
			thief, ok, err := c.AcquireLease(ctx, leaseKey, "thief", time.Hour)
			if err != nil || !ok {
				t.Fatalf("taking the lease: %v, %v", ok, err)
			}
			close(g.open)
			waitFor(t, "process a to find its lease lost", func() bool {
				return strings.Contains(logA.String(), "lost the partition to another process")
			})
			stopA()
			if err := <-aDone; err != nil {
				t.Fatal(err)
			}
			outStream := keys.Stream("out", 0)
			if n, _ := rdb.XLen(ctx, outStream).Result(); n != 10 {
				t.Fatalf("process a wrote %d outputs, want the batch's 10", n)
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
