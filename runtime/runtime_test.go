package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

func init() {
	// test.shuffle delays each message by a few thousand iterations of busy work that depend on the
	// message, so that the lanes of a stage finish in a jumbled order.
	stages.Register("test.shuffle", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		h := fnv.New32a()
		_, _ = fmt.Fprint(h, m.Value["seq"]) // a hash's Write never fails
		spin := int(h.Sum32() % 20000)
		x := 0
		for i := 0; i < spin; i++ {
			x ^= i
		}
		m.Value["spin"] = x % 2
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
	// test.flaky fails the first attempt at every message whose seq is divisible by 10, once per
	// run (the message's field run).
	stages.Register("test.flaky", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		if seq, ok := m.Value["seq"].(json.Number); ok && strings.HasSuffix(string(seq), "0") {
			if _, seen := flakySeen.LoadOrStore(fmt.Sprint(m.Value["run"], "/", seq), true); !seen {
				return nil, errors.New("flaky failure")
			}
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
}

// flakySeen holds the messages test.flaky failed, by run and seq.
var flakySeen sync.Map

// countBy counts messages by the number in one of their fields, for tally.
func countBy(t *testing.T, msgs []map[string]any, field string) map[int]int {
	t.Helper()
	got := map[int]int{}
	for _, m := range msgs {
		n, ok := m[field].(float64)
		if !ok {
			t.Fatalf("a message without a number in %s: %v", field, m)
		}
		got[int(n)]++
	}
	return got
}

// TestPerKeyOrderUnderConcurrency runs a few thousand keyed messages from a file through a stage that
// works on eight messages of a partition at once, and checks that every message arrives exactly once
// and that each key's messages keep their order.
func TestPerKeyOrderUnderConcurrency(t *testing.T) {
	t.Parallel()
	const messages, keys = 3000, 37
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var lines strings.Builder
	for i := 0; i < messages; i++ {
		fmt.Fprintf(&lines, `{"key":"k%d","seq":%d}`+"\n", i%keys, i)
	}
	writeFile(t, in, lines.String())
	src := `
pipeline "order" {}
variable "in" {}
variable "out" {}
topic "events" {
  partitions = 4
  key        = msg.key
}
source "file" {
  kind   = "file"
  path   = var.in
  output = topic.events
}
stage "shuffle" {
  kind        = "go"
  func        = "test.shuffle"
  input       = topic.events
  concurrency = 8
}
stage "again" {
  kind        = "go"
  func        = "test.shuffle"
  input       = stage.shuffle
  concurrency = 3
}
sink "out" {
  kind  = "file"
  input = stage.again
  path  = var.out
}
`
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, src, "in="+in, "out="+out)
			j := runJob(t, b.open(t), plan, runtime.Options{BatchSize: 100})
			got := jsonLines(t, readFile(t, out))
			if dups := tally(t, countBy(t, got, "seq"), messages); dups > 0 {
				t.Fatalf("%d messages arrived twice", dups)
			}
			keyOrderKept(t, "output", got, "key", "seq")
			if n := j.node(t, "again"); n.In != messages || n.Out != messages {
				t.Errorf("again: %+v", n)
			}
		})
	}
}

// TestRetriesThenSucceeds fails the first attempt at some messages: they are retried in process and
// arrive, in order, without dead letters.
func TestRetriesThenSucceeds(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	plan := buildSource(t, `
pipeline "retry" {}
variable "out" {}
variable "run" {}
retry "fast" {
  max_attempts = 3
  initial      = "1ms"
  max          = "5ms"
}
topic "in" {
  partitions = 2
  key        = msg.key
}
source "gen" {
  kind     = "generate"
  count    = 100
  output   = topic.in
  template = { key = "k${index % 3}", seq = index, run = var.run }
}
stage "flaky" {
  kind  = "go"
  func  = "test.flaky"
  input = topic.in
  retry = retry.fast
}
sink "out" {
  kind  = "file"
  input = stage.flaky
  path  = var.out
}
`, "out="+out, "run="+t.Name()+itoa(prefixes.Add(1)))
	j := runJob(t, server.open(t), plan, runtime.Options{})
	got := jsonLines(t, readFile(t, out))
	if dups := tally(t, countBy(t, got, "seq"), 100); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}
	keyOrderKept(t, "output", got, "key", "seq")
	if n := j.node(t, "flaky"); n.FailedAttempts != 10 || n.Retries != 10 || n.DeadLettered != 0 {
		t.Errorf("flaky: %+v", n)
	}
}

// TestMalformedEntriesAreDeadLettered writes entries into a topic the way a broken producer would:
// the malformed ones go to the stage's dead-letter stream with the reason, the others pass, and
// nothing loops.
func TestMalformedEntriesAreDeadLettered(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, `
pipeline "bad" {}
variable "out" {}
topic "in" { partitions = 2 }
stage "pass" {
  kind  = "filter"
  input = topic.in
  where = true
}
sink "out" {
  kind  = "file"
  input = stage.pass
  path  = var.out
}
`, "out="+out)
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			add := func(p int, values ...any) {
				t.Helper()
				if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: keys.Stream("in", p), Values: values}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			add(0, "payload", `{"n":1}`)
			add(0, "payload", `{"n":`) // invalid JSON
			add(1, "payload", `{"n":2}`, "headers", `not json`)
			add(1, "n", "3", "note", "flat") // written like redis-cli would: a flat object
			add(0, "payload", `[1,2]`)       // valid JSON, not an object: the stage fails it for good
			j := runJob(t, c, plan, runtime.Options{})

			got := jsonLines(t, readFile(t, out))
			sameMessages(t, "passed", got, []map[string]any{{"n": 1.0}, {"n": "3", "note": "flat"}})
			dead, err := c.Universal().XRange(ctx, keys.DeadLetter("pass"), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) != 3 {
				t.Fatalf("%d dead letters, want 3: %v", len(dead), dead)
			}
			reasons := ""
			for _, d := range dead {
				env := jsonObject(t, d.Values["payload"].(string))
				reasons += env["error"].(string) + "\n"
				if env["node"] != "pass" || env["stream"] == "" || env["id"] == "" {
					t.Errorf("envelope %v", env)
				}
			}
			for _, want := range []string{"payload is not valid JSON", "headers", "not an object"} {
				if !strings.Contains(reasons, want) {
					t.Errorf("no dead letter says %q:\n%s", want, reasons)
				}
			}
			if j.summary.DeadLettered() != 3 {
				t.Errorf("summary counts %d dead letters", j.summary.DeadLettered())
			}
		})
	}
}

// TestServiceStopsCleanly runs a pipeline as a service, stops it, and checks that the work in flight
// was committed and that it left no lease, consumer or membership behind.
func TestServiceStopsCleanly(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	plan := buildSource(t, `
pipeline "svc" {}
variable "out" {}
topic "in" {
  partitions = 3
  key        = msg.k
}
stage "pass" {
  kind  = "map"
  input = topic.in
  set   = { seen = true }
}
sink "out" {
  kind  = "file"
  input = stage.pass
  path  = var.out
}
`, "out="+out)
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500; i++ {
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(fmt.Sprintf(`{"k":"k%d","i":%d}`, i%7, i)), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	var log syncBuffer
	done := make(chan error, 1)
	var summary atomic.Pointer[runtime.Summary]
	rt, err := runtime.New(plan, runtime.Options{Redis: c, Logger: newLogger(&log), LeaseTTL: 30 * time.Second, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s, err := rt.Run(runCtx)
		summary.Store(s)
		done <- err
	}()
	// Wait until everything was delivered, by watching the sink's group, then stop.
	waitFor(t, "the sink to acknowledge 500 messages", func() bool {
		return acked(t, c, plan.KeyPrefix, "pass.out", 3, "out") == 500
	})
	waitFor(t, "the snapshot to show all partitions drained", func() bool {
		s := rt.Snapshot()
		if rt.Ready() != nil || len(s.Partitions) != 6 || s.Leases != 6 {
			return false
		}
		for _, p := range s.Partitions {
			if p.Lag != 0 || p.Pending != 0 {
				return false
			}
		}
		return s.Nodes[0].In == 500 && s.DeadLetters["pass"] == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if dups := tally(t, countBy(t, jsonLines(t, readFile(t, out)), "i"), 500); dups > 0 {
		t.Errorf("%d messages written twice to the file", dups)
	}
	// Leases released (a successor need not wait for their expiry), consumers and membership gone.
	leftovers, err := c.Universal().Keys(ctx, plan.KeyPrefix+":*lease*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range leftovers {
		if !strings.HasSuffix(k, ":fence") {
			t.Errorf("lease %s left behind", k)
		}
	}
	if n, _ := c.Universal().ZCard(ctx, redis.Keys{Prefix: plan.KeyPrefix}.Members()).Result(); n != 0 {
		t.Errorf("%d members left", n)
	}
	for p := 0; p < 3; p++ {
		consumers, err := c.Universal().XInfoConsumers(ctx, redis.Keys{Prefix: plan.KeyPrefix}.Stream("in", p), "pass").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(consumers) != 0 {
			t.Errorf("partition %d keeps consumers %v", p, consumers)
		}
	}
	if s := summary.Load(); s == nil || s.Nodes[0].In != 500 {
		t.Errorf("summary %+v", s)
	}
}

// acked sums, over a topic's partitions, the entries a group has delivered and acknowledged. It
// reads XINFO's lag, which Redis does not keep exactly through a restart from its AOF: after one,
// compare the group's last delivered ID with the stream's last entry (pgcdc_kills_test.go).
func acked(t *testing.T, c *redis.Client, prefix, topic string, partitions int, group string) int64 {
	t.Helper()
	var n int64
	for p := 0; p < partitions; p++ {
		st, err := c.StreamStats(context.Background(), redis.Keys{Prefix: prefix}.Stream(topic, p))
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range st.Groups {
			if g.Name == group {
				n += st.Length - g.Lag - g.Pending
			}
		}
	}
	return n
}

// waitFor polls a condition until it holds; the deadline only keeps a broken test from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, what, time.Minute, cond)
}

// waitForWithin is waitFor with a deadline of its own.
func waitForWithin(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	waitForEvery(t, what, within, 20*time.Millisecond, cond)
}

// waitForEvery is waitForWithin polling every interval, for a condition that reads a view which
// its server refreshes only when it has not been read for a while.
func waitForEvery(t *testing.T, what string, within, interval time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// waitProgress waits until value reaches want (or passes it: the caller checks the count), as long
// as it keeps moving: it fails the test and returns false when value has not changed for a minute
// (a stall), however long the whole takes on a loaded machine.
func waitProgress(t *testing.T, what string, want int64, value func() int64) bool {
	t.Helper()
	last, since := value(), time.Now()
	for last < want {
		if time.Since(since) > time.Minute {
			t.Errorf("waiting for %s: stalled at %d of %d for a minute", what, last, want)
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling
		if v := value(); v != last {
			last, since = v, time.Now()
		}
	}
	return true
}

// TestRetentionTrimsWhatWasRead runs a topic with max_len = 10 as a service: once the stage has read
// everything, the streams are trimmed to 10 entries per partition.
func TestRetentionTrimsWhatWasRead(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	plan := buildSource(t, `
pipeline "trim" {}
topic "in" {
  partitions = 2
  retention {
    max_len = 10
  }
}
stage "pass" {
  kind   = "filter"
  input  = topic.in
  output = topic.kept
  where  = true
}
topic "kept" {}
sink "out" {
  kind  = "stdout"
  input = topic.kept
}
`)
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(fmt.Sprintf(`{"i":%d}`, i)), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var out, log syncBuffer
	go func() {
		_, err := runtime.Run(runCtx, plan, runtime.Options{Redis: c, Stdout: &out, Logger: newLogger(&log), TrimInterval: 20 * time.Millisecond})
		done <- err
	}()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	waitFor(t, "both partitions trimmed to 10 entries", func() bool {
		for p := 0; p < 2; p++ {
			if n, err := c.Universal().XLen(ctx, keys.Stream("in", p)).Result(); err != nil || n != 10 {
				return false
			}
		}
		return true
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	// All 100, once each: trimming must not outrun the stage.
	if dups := tally(t, countBy(t, jsonLines(t, out.String()), "i"), 100); dups > 0 {
		t.Errorf("%d messages delivered twice", dups)
	}
}
