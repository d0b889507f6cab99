package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The safety paths: what the runtime does when a step that guards a message fails. A sink's flush
// fails, a lease moves to another process (taken from a source, lost at renewal, given up when a
// process joins), a consumer dies with entries pending on a partition without leases, a commit's
// writes fail inside the transaction that acks. Faults are injected from outside the product: a
// go-redis hook on the runtime's client fails the commands a test picks, the test takes a lease
// itself, or a writer fails while the test says so.

// bgRun is a pipeline run in the background.
type bgRun struct {
	rt      *runtime.Runtime
	log     *syncBuffer
	cancel  context.CancelFunc
	done    chan struct{}
	summary *runtime.Summary
	err     error
}

// runInBackground runs a plan in the background (as a service unless opts.UntilDrained) until stop, or until
// the test ends. The deadline only keeps a broken test from hanging.
func runInBackground(t *testing.T, plan *flow.Plan, opts runtime.Options, prepare ...func(*runtime.Runtime)) *bgRun {
	t.Helper()
	r := &bgRun{log: &syncBuffer{}, done: make(chan struct{})}
	opts.Logger = newLogger(r.log)
	if opts.Stdin == nil {
		opts.Stdin = strings.NewReader("")
	}
	if opts.Stdout == nil {
		opts.Stdout = io.Discard
	}
	rt, err := runtime.New(plan, opts)
	if err != nil {
		t.Fatal(err)
	}
	r.rt = rt
	for _, p := range prepare {
		p(rt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	r.cancel = cancel
	go func() {
		defer close(r.done)
		r.summary, r.err = rt.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// stop ends the run and returns its error.
func (r *bgRun) stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// wait waits for a job to end by itself and returns its error.
func (r *bgRun) wait(t *testing.T) error {
	t.Helper()
	<-r.done
	if errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("the run did not end:\n%s", r.log.String())
	}
	return r.err
}

// logged reports whether the run's log has a line containing s.
func (r *bgRun) logged(s string) bool { return strings.Contains(r.log.String(), s) }

// unackedOf returns the entries of a stream that a group has not acknowledged: pending, or not yet
// delivered (all of them before the group exists).
func unackedOf(t *testing.T, c *redis.Client, stream, group string) int64 {
	t.Helper()
	st, err := c.StreamStats(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.Groups {
		if g.Name == group {
			return g.Lag + g.Pending
		}
	}
	return st.Length
}

// pendingCount returns how many entries of a stream are pending for a group.
func pendingCount(t *testing.T, c *redis.Client, stream, group string) int64 {
	t.Helper()
	p, err := c.Universal().XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// lengthOf returns a stream's length.
func lengthOf(t *testing.T, c *redis.Client, stream string) int64 {
	t.Helper()
	n, err := c.StreamLen(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// injector is a go-redis hook that fails the calls a test picks: while it has budget left, a
// command (or a pipeline holding a command) that match accepts fails with err, without being sent.
type injector struct {
	match  func(goredis.Cmder) bool
	err    error
	budget atomic.Int64 // calls left to fail
	hits   atomic.Int64 // calls failed
	seen   atomic.Int64 // calls that matched, failed or not
}

// inject adds an injector to a client; it fails nothing until armed.
func inject(c *redis.Client, err error, match func(goredis.Cmder) bool) *injector {
	f := &injector{match: match, err: err}
	c.Universal().AddHook(f)
	return f
}

// arm makes the next n matching calls fail (math.MaxInt64: until disarmed).
func (f *injector) arm(n int64) { f.budget.Store(n) }

func (f *injector) disarm() { f.budget.Store(0) }

// take reports whether a call with these commands fails now.
func (f *injector) take(cmds ...goredis.Cmder) bool {
	hit := false
	for _, c := range cmds {
		if f.match(c) {
			hit = true
			break
		}
	}
	if !hit {
		return false
	}
	f.seen.Add(1)
	for {
		left := f.budget.Load()
		if left <= 0 {
			return false
		}
		if f.budget.CompareAndSwap(left, left-1) {
			f.hits.Add(1)
			return true
		}
	}
}

func (f *injector) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (f *injector) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if f.take(cmd) {
			cmd.SetErr(f.err)
			return f.err
		}
		return next(ctx, cmd)
	}
}

func (f *injector) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if f.take(cmds...) {
			for _, c := range cmds {
				c.SetErr(f.err)
			}
			return f.err
		}
		return next(ctx, cmds)
	}
}

// cmdNamed matches commands by name (lower case, as go-redis names them).
func cmdNamed(names ...string) func(goredis.Cmder) bool {
	return func(c goredis.Cmder) bool {
		for _, n := range names {
			if c.Name() == n {
				return true
			}
		}
		return false
	}
}

// scriptOn matches a script call (EVAL or EVALSHA) whose first key is key.
func scriptOn(key string) func(goredis.Cmder) bool {
	return func(c goredis.Cmder) bool {
		args := c.Args()
		return (c.Name() == "eval" || c.Name() == "evalsha") && len(args) > 3 && args[3] == key
	}
}

// errInjected is a failure that waiting heals, as a dropped connection is.
var errInjected = errors.New("injected failure: connection reset by peer")

// failingWriter is an output that fails every write while it is failing, as a full disk does.
type failingWriter struct {
	mu      sync.Mutex
	failing bool
	failed  int
	out     bytes.Buffer
}

func (w *failingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing {
		w.failed++
		return 0, errors.New("injected failure: no space left on device")
	}
	return w.out.Write(p)
}

func (w *failingWriter) set(failing bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failing = failing
}

func (w *failingWriter) failures() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

func (w *failingWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

// TestSinkFlushFailureRedeliversTheBatch makes a stdout sink's output fail (its flush, which runs
// before a batch is acknowledged, gets an error) and then work again: while it fails nothing is
// acknowledged or dead-lettered, and once it works every message comes out, as whole lines.
func TestSinkFlushFailureRedeliversTheBatch(t *testing.T) {
	const n = 20 // a batch whose lines fit in the sink's buffer: only the flush writes
	c := server.open(t)
	plan := buildSource(t, `
pipeline "flush" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`)
	publishNumbered(t, c, plan, 0, n)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	backlog := func() int64 {
		return unackedOf(t, c, keys.Stream("in", 0), "out") + unackedOf(t, c, keys.Stream("in", 1), "out")
	}
	w := &failingWriter{failing: true}
	run := runInBackground(t, plan, runtime.Options{Redis: c, Stdout: w})
	waitFor(t, "the flush to fail three times (the batch delivered again and failing again), or an ack", func() bool {
		return w.failures() >= 3 || backlog() < n
	})
	if b := backlog(); b != n {
		t.Fatalf("%d of %d messages unacknowledged while the output fails: a batch was acknowledged that was not out", b, n)
	}
	if !run.logged("the batch will be delivered again") {
		t.Errorf("the failed flush is not logged:\n%s", run.log.String())
	}
	w.set(false)
	waitFor(t, "every message to be written and acknowledged", func() bool {
		return backlog() == 0 && len(jsonLines(t, w.String())) >= n
	})
	if err := run.stop(); err != nil {
		t.Fatalf("%v\n%s", err, run.log.String())
	}
	got := map[int]int{}
	for _, m := range jsonLines(t, w.String()) {
		got[int(m["i"].(float64))]++
	}
	dups := tally(t, got, n)
	failures := w.failures()
	t.Logf("%d failed flushes; %d messages written, %d of them again", failures, n+dups, dups)
	if dups > failures*n {
		t.Errorf("%d duplicates after %d failed flushes of at most %d messages", dups, failures, n)
	}
	if dead := lengthOf(t, c, keys.DeadLetter("out")); dead != 0 {
		t.Errorf("%d messages dead-lettered", dead)
	}
}

// liveNode returns a node's counters as a run sees them now.
func liveNode(r *bgRun, name string) runtime.NodeSummary {
	return nodeCounts(r.rt.Snapshot().Nodes, name)
}

// nodeIn returns a node's counters from a summary's or a snapshot's nodes.
func nodeCounts(nodes []runtime.NodeSummary, name string) runtime.NodeSummary {
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return runtime.NodeSummary{}
}

// numberedFile writes a file of n numbered JSON lines and returns its path.
func numberedFile(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.jsonl")
	var b strings.Builder
	if err := numberedLines(&b, 0, n); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, b.String())
	return path
}

// positionLine returns the line a file source's checkpoint is at (0 without one).
func positionLine(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	raw, found, err := c.ReadCheckpoint(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		return 0
	}
	var p struct{ Line int64 }
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		t.Fatal(err)
	}
	return p.Line
}

// stealLease makes a lease expire and another owner take it, as when its holder stalls past its
// TTL: the test holds it until it releases it.
func stealLease(t *testing.T, c *redis.Client, key string) redis.Lease {
	t.Helper()
	ctx := context.Background()
	if err := c.Universal().Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	thief, ok, err := c.AcquireLease(ctx, key, "thief", time.Hour)
	if err != nil || !ok {
		t.Fatalf("taking the lease %s: %v, %v", key, ok, err)
	}
	return thief
}

// heldBackSource starts a run of the source "lines" alone and waits until it is held back at its
// topic's cap, mid-file; it returns the run and the checkpoint's line then.
func heldBackSource(t *testing.T, c *redis.Client, plan *flow.Plan, ttl time.Duration, n int) (*bgRun, int64) {
	t.Helper()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	a := runInBackground(t, plan, runtime.Options{Redis: c, Nodes: []string{"lines"}, ProcessID: "a", LeaseTTL: ttl})
	waitFor(t, "the source to be held back at the topic's cap", func() bool { return liveNode(a, "lines").HeldBackBy == "in" })
	at := positionLine(t, c, keys.SourcePosition("lines"))
	if at <= 0 || at >= int64(n) {
		t.Fatalf("the source is held back at line %d of %d, want mid-file", at, n)
	}
	if l := lengthOf(t, c, keys.Stream("in", 0)); l != at {
		t.Fatalf("the topic has %d entries and the checkpoint says %d lines: they are written together", l, at)
	}
	return a, at
}

// TestSourceLeaseTakenBeforeACommitStopsTheSource: another process takes a file source's lease
// while the source waits at a full topic, before the source notices at its next renewal (an hour
// away). Its next batch's checkpoint is refused (the lease fences it), so the source stops there
// without moving its position, and the next owner goes on from the position: every line reaches
// the topic, and only the lines of the refused batch twice (none with effectively_once).
func TestSourceLeaseTakenBeforeACommitStopsTheSource(t *testing.T) {
	const n = 400
	for _, delivery := range []string{"at_least_once", "effectively_once"} {
		t.Run(delivery, func(t *testing.T) {
			ctx := context.Background()
			c := server.open(t)
			out := fmt.Sprintf("srclease-%d:out", prefixes.Add(1))
			plan := buildTestdata(t, "srclease.hcl", "delivery="+delivery, "out="+out, "path="+numberedFile(t, n))
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			topic := keys.Stream("in", 0)

			a, at := heldBackSource(t, c, plan, time.Hour, n)
			thief := stealLease(t, c, keys.SourceLease("lines"))
			// A sink makes room in the topic: the source's next batch goes to Redis with the lease it
			// no longer holds.
			sink := runInBackground(t, plan, runtime.Options{Redis: c, Nodes: []string{"out"}, ProcessID: "sink"})
			waitFor(t, "the source to stop", func() bool { return a.logged("source lease lost; another process runs the source now") })
			if p := positionLine(t, c, keys.SourcePosition("lines")); p != at {
				t.Errorf("the checkpoint moved from line %d to %d after the lease was taken", at, p)
			}
			refused := lengthOf(t, c, topic) - at
			if refused <= 0 {
				t.Errorf("the topic has %d entries past the checkpoint: no batch of the source met the fence", refused)
			}
			for _, r := range []*bgRun{sink, a} {
				if err := r.stop(); err != nil {
					t.Fatalf("%v\n%s", err, r.log.String())
				}
			}
			if err := c.ReleaseLease(ctx, thief); err != nil {
				t.Fatal(err)
			}
			j := runJob(t, c, plan, runtime.Options{ProcessID: "b"})
			if !strings.Contains(j.log, "resuming where the source stopped") {
				t.Errorf("the next owner did not resume at the checkpoint:\n%s", j.log)
			}
			reread := tally(t, arrivals(t, c, topic), n)
			dups := tally(t, arrivals(t, c, out), n)
			t.Logf("%s: held back at line %d; %d lines written without their checkpoint; %d lines in the topic twice, %d delivered twice",
				delivery, at, refused, reread, dups)
			want := int(refused)
			if delivery == "effectively_once" {
				want = 0
			}
			if reread != want || dups != want {
				t.Errorf("%d lines in the topic twice and %d delivered twice, want %d", reread, dups, want)
			}
		})
	}
}

// TestSourceLeaseTakenAtRenewalStopsTheSource: another process takes a file source's lease while
// the source waits at a full topic; the source's next renewal finds the lease held by the other
// process, and the source stops without writing anything more. The next owner goes on from the
// checkpoint: every line reaches the topic once.
func TestSourceLeaseTakenAtRenewalStopsTheSource(t *testing.T) {
	const n = 400
	ctx := context.Background()
	c := server.open(t)
	out := fmt.Sprintf("srclease-%d:out", prefixes.Add(1))
	plan := buildTestdata(t, "srclease.hcl", "delivery=at_least_once", "out="+out, "path="+numberedFile(t, n))
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	topic := keys.Stream("in", 0)

	a, at := heldBackSource(t, c, plan, 2*time.Second, n)
	thief := stealLease(t, c, keys.SourceLease("lines"))
	waitFor(t, "the source to stop", func() bool { return a.logged("source lease lost; another process runs the source now") })
	if !a.logged("source lease lost to another process; stopping the source") {
		t.Errorf("the renewal did not find the lease lost:\n%s", a.log.String())
	}
	if p, l := positionLine(t, c, keys.SourcePosition("lines")), lengthOf(t, c, topic); p != at || l != at {
		t.Errorf("after the lease was taken the checkpoint moved from line %d to %d and the topic from %d entries to %d", at, p, at, l)
	}
	if err := a.stop(); err != nil {
		t.Fatalf("%v\n%s", err, a.log.String())
	}
	if err := c.ReleaseLease(ctx, thief); err != nil {
		t.Fatal(err)
	}
	runJob(t, c, plan, runtime.Options{ProcessID: "b"})
	if reread := tally(t, arrivals(t, c, topic), n); reread != 0 {
		t.Errorf("%d lines reached the topic twice", reread)
	}
	if dups := tally(t, arrivals(t, c, out), n); dups != 0 {
		t.Errorf("%d lines delivered twice", dups)
	}
}

// TestSourceLeaseExpiredAndFreeIsTakenAgain: a file source's lease expires (its process stalled)
// and nobody takes it; the next renewal takes it again and the source goes on, losing nothing and
// writing nothing twice.
func TestSourceLeaseExpiredAndFreeIsTakenAgain(t *testing.T) {
	const n = 400
	c := server.open(t)
	out := fmt.Sprintf("srclease-%d:out", prefixes.Add(1))
	plan := buildTestdata(t, "srclease.hcl", "delivery=at_least_once", "out="+out, "path="+numberedFile(t, n))
	keys := redis.Keys{Prefix: plan.KeyPrefix}

	a, _ := heldBackSource(t, c, plan, 2*time.Second, n)
	if err := c.Universal().Del(context.Background(), keys.SourceLease("lines")).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the source to take its lease again", func() bool { return a.logged("source lease expired and was taken again") })
	sink := runInBackground(t, plan, runtime.Options{Redis: c, Nodes: []string{"out"}, ProcessID: "sink"})
	waitFor(t, "every line to be delivered", func() bool {
		return a.logged("source finished") && len(arrivals(t, c, out)) == n
	})
	for _, r := range []*bgRun{sink, a} {
		if err := r.stop(); err != nil {
			t.Fatalf("%v\n%s", err, r.log.String())
		}
	}
	if a.logged("source lease lost") {
		t.Errorf("the source stopped although nobody else took its lease:\n%s", a.log.String())
	}
	if reread := tally(t, arrivals(t, c, keys.Stream("in", 0)), n); reread != 0 {
		t.Errorf("%d lines reached the topic twice", reread)
	}
	if dups := tally(t, arrivals(t, c, out), n); dups != 0 {
		t.Errorf("%d lines delivered twice", dups)
	}
}

// TestLeaseLostAtRenewalStopsTheWorker: another process takes a partition's lease (this process
// stalled past its TTL, say), and this process's next renewal finds it gone. Idle, the worker stops
// reading: this process gives the partition up and tries to take it again, as it would a free one.
// With a batch in flight, the batch is finished but its acknowledgement is refused. Either way the
// next owner processes what was not acknowledged, and nothing is lost.
func TestLeaseLostAtRenewalStopsTheWorker(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		ctx := context.Background()
		c := server.open(t)
		plan := buildTestdata(t, "gated.hcl")
		keys := redis.Keys{Prefix: plan.KeyPrefix}
		leaseKey := keys.Lease("in", 0, "work")
		in, out := keys.Stream("in", 0), keys.Stream("out", 0)
		run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
		publishRun(t, c, plan, run, 0, 10)

		ca := server.open(t)
		acquires := inject(ca, nil, func(cmd goredis.Cmder) bool {
			args := cmd.Args() // AcquireLease: the lease and its fencing counter
			return len(args) > 4 && args[3] == leaseKey && args[4] == redis.LeaseFence(leaseKey)
		})
		a := runInBackground(t, plan, runtime.Options{Redis: ca, Nodes: []string{"work"}, ProcessID: "a", LeaseTTL: 2 * time.Second})
		waitFor(t, "the first messages to be processed", func() bool {
			return len(arrivals(t, c, out)) == 10 && unackedOf(t, c, in, "work") == 0
		})
		thief := stealLease(t, c, leaseKey)
		took := acquires.seen.Load()
		waitFor(t, "the renewal to find the lease lost", func() bool { return a.logged("lease lost; stopping the partition") })
		waitFor(t, "the process to try to take the partition again, its worker stopped", func() bool {
			return acquires.seen.Load() > took
		})
		publishRun(t, c, plan, run, 10, 20)
		if err := a.stop(); err != nil {
			t.Fatalf("%v\n%s", err, a.log.String())
		}
		if p := pendingCount(t, c, in, "work"); p != 0 {
			t.Errorf("%d entries pending after the worker stopped: it read on", p)
		}
		if err := c.ReleaseLease(ctx, thief); err != nil {
			t.Fatal(err)
		}
		runJob(t, c, plan, runtime.Options{Nodes: []string{"work"}, ProcessID: "b"})
		if dups := tally(t, arrivals(t, c, out), 20); dups != 0 {
			t.Errorf("%d messages processed twice", dups)
		}
	})
	t.Run("in flight", func(t *testing.T) {
		ctx := context.Background()
		c := server.open(t)
		plan := buildTestdata(t, "gated.hcl")
		keys := redis.Keys{Prefix: plan.KeyPrefix}
		leaseKey := keys.Lease("in", 0, "work")
		in, out := keys.Stream("in", 0), keys.Stream("out", 0)
		run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
		g := &gate{entered: make(chan struct{}), open: make(chan struct{})}
		gates.Store(run, g)
		defer gates.Delete(run)
		publishRun(t, c, plan, run, 0, 10)

		a := runInBackground(t, plan, runtime.Options{Redis: c, Nodes: []string{"work"}, ProcessID: "a", LeaseTTL: 2 * time.Second})
		<-g.entered // the batch is read; message 0 holds it
		thief := stealLease(t, c, leaseKey)
		waitFor(t, "the renewal to find the lease lost", func() bool { return a.logged("lease lost; stopping the partition") })
		close(g.open)
		waitFor(t, "the batch's acknowledgement to be refused, or an ack", func() bool {
			return a.logged("lost the partition to another process") || pendingCount(t, c, in, "work") < 10
		})
		if p := pendingCount(t, c, in, "work"); p != 10 {
			t.Errorf("%d of the batch's 10 entries pending: the others were acknowledged without the lease", p)
		}
		written := len(arrivals(t, c, out))
		if err := a.stop(); err != nil {
			t.Fatalf("%v\n%s", err, a.log.String())
		}
		if err := c.ReleaseLease(ctx, thief); err != nil {
			t.Fatal(err)
		}
		runJob(t, c, plan, runtime.Options{Nodes: []string{"work"}, ProcessID: "b"})
		dups := tally(t, arrivals(t, c, out), 10)
		t.Logf("the refused batch wrote %d outputs; %d messages processed twice", written, dups)
		if dups != written {
			t.Errorf("%d messages processed twice, want the %d that the refused batch wrote", dups, written)
		}
	})
}

// holds keep safety.hold's messages of a run from going on until the test releases them.
var holds sync.Map // run -> *hold

// hold records the keys of the messages of a run that safety.hold has taken, and lets them go
// once released.
type hold struct {
	mu       sync.Mutex
	keys     map[string]bool
	released chan struct{}
}

func newHold() *hold { return &hold{keys: map[string]bool{}, released: make(chan struct{})} }

// partitionsHeld returns how many of a topic's partitions have a message held.
func (h *hold) partitionsHeld(partitions int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	held := map[int]bool{}
	for k := range h.keys {
		held[redis.Partition(k, partitions)] = true
	}
	return len(held)
}

func init() {
	// safety.hold passes its message on once the hold of its run (field run) is released; messages
	// of runs without a hold pass at once.
	stages.Register("safety.hold", func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
		if v, ok := holds.Load(fmt.Sprint(m.Value["run"])); ok {
			h := v.(*hold)
			h.mu.Lock()
			h.keys[m.Key] = true
			h.mu.Unlock()
			select {
			case <-h.released:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
}

// publishKeyed publishes messages from..to-1 to topic in, keyed over 40 keys, each with its number
// and run.
func publishKeyed(t *testing.T, c *redis.Client, plan *flow.Plan, run string, from, to int) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		msg := fmt.Sprintf(`{"run":%q,"k":"k%d","i":%d}`, run, i%40, i)
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(msg), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRebalancingGivesPartitionsUp: a process owns every partition of a stage, with batches in
// flight, when a second process joins. The first gives half of them up, finishing their batches
// before it releases their leases; the second takes them over. When the second leaves, the first
// takes them back. Nothing is lost, and on a single server nothing is processed twice.
func TestRebalancingGivesPartitionsUp(t *testing.T) {
	const n, partitions = 200, 4
	c := server.open(t)
	plan := buildSource(t, `
pipeline "rebalance" {}
topic "in" {
  partitions = 4
  key        = msg.k
}
topic "out" {
  partitions = 4
  key        = msg.k
}
stage "work" {
  kind        = "go"
  func        = "safety.hold"
  input       = topic.in
  output      = topic.out
  concurrency = 4
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
`)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
	h := newHold()
	holds.Store(run, h)
	defer holds.Delete(run)
	publish := func(from, to int) { publishKeyed(t, c, plan, run, from, to) }
	arrived := func() map[int]int {
		got := map[int]int{}
		for p := range partitions {
			for i, k := range arrivals(t, c, keys.Stream("out", p)) {
				got[i] += k
			}
		}
		return got
	}
	opts := func(id string) runtime.Options {
		return runtime.Options{Redis: c, Nodes: []string{"work"}, ProcessID: id, LeaseTTL: 2 * time.Second}
	}
	publish(0, n)

	a := runInBackground(t, plan, opts("a"))
	waitFor(t, "process a to own every partition, each with a batch in flight", func() bool {
		return a.rt.Snapshot().Leases == partitions && h.partitionsHeld(partitions) == partitions
	})
	b := runInBackground(t, plan, opts("b"))
	waitFor(t, "process a to give half of the partitions up", func() bool {
		return strings.Count(a.log.String(), "giving a partition up") == partitions/2
	})
	if got := len(arrived()); got != 0 {
		t.Fatalf("%d messages arrived while every one was held: nothing was in flight", got)
	}
	if l := b.rt.Snapshot().Leases; l != 0 {
		t.Errorf("process b holds %d leases while a still finishes their batches", l)
	}
	close(h.released)
	waitFor(t, "every message to arrive and the processes to share the partitions", func() bool {
		return len(arrived()) == n && a.rt.Snapshot().Leases == partitions/2 && b.rt.Snapshot().Leases == partitions/2
	})
	publish(n, 2*n)
	waitFor(t, "the next messages to arrive, shared by both", func() bool { return len(arrived()) == 2*n })
	if in := liveNode(b, "work").In; in == 0 {
		t.Errorf("process b processed nothing")
	}
	if err := b.stop(); err != nil {
		t.Fatalf("%v\n%s", err, b.log.String())
	}
	waitFor(t, "process a to take every partition back", func() bool { return a.rt.Snapshot().Leases == partitions })
	publish(2*n, 3*n)
	waitFor(t, "the last messages to arrive", func() bool { return len(arrived()) == 3*n })
	if err := a.stop(); err != nil {
		t.Fatalf("%v\n%s", err, a.log.String())
	}
	if dups := tally(t, arrived(), 3*n); dups != 0 {
		t.Errorf("%d messages processed twice", dups)
	}
}

// TestDeadConsumersEntriesAreTakenOver: on a partition without leases (ordering = "none"), a
// consumer read entries and died. A live process takes them over once they have been idle for the
// claim delay (shortened here), page after page, also when its first attempt fails: every message
// is processed, once.
func TestDeadConsumersEntriesAreTakenOver(t *testing.T) {
	const n, dead = 1200, 1100 // more than one reclaim call takes (10 pages of 100)
	ctx := context.Background()
	c := server.open(t)
	plan := buildSource(t, `
pipeline "none" {}
topic "in" {}
topic "out" {}
stage "work" {
  kind     = "map"
  input    = topic.in
  output   = topic.out
  ordering = "none"
  set      = { seen = true }
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
`)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	in, out := keys.Stream("in", 0), keys.Stream("out", 0)
	publishNumbered(t, c, plan, 0, n)
	if err := c.EnsureGroup(ctx, in, "work"); err != nil {
		t.Fatal(err)
	}
	// A consumer of another process reads entries, and the process dies.
	read, err := c.Universal().XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: "work", Consumer: "dead", Streams: []string{in, ">"}, Count: dead,
	}).Result()
	if err != nil || len(read) != 1 || len(read[0].Messages) != dead {
		t.Fatalf("the dead consumer's read: %v, %v", read, err)
	}

	rc := server.open(t)
	claims := inject(rc, errInjected, cmdNamed("xautoclaim"))
	claims.arm(1) // the first takeover fails as a dropped connection would
	b := runInBackground(t, plan, runtime.Options{Redis: rc, Nodes: []string{"work"}, ProcessID: "b"},
		func(rt *runtime.Runtime) { runtime.SetClaimIdle(rt, 100*time.Millisecond) })
	waitFor(t, "every message to be processed and acknowledged", func() bool {
		return len(arrivals(t, c, out)) == n && unackedOf(t, c, in, "work") == 0
	})
	if err := b.stop(); err != nil {
		t.Fatalf("%v\n%s", err, b.log.String())
	}
	if dups := tally(t, arrivals(t, c, out), n); dups != 0 {
		t.Errorf("%d messages processed twice", dups)
	}
	if claims.hits.Load() != 1 || claims.seen.Load() < 3 {
		t.Errorf("%d takeovers failed of %d, want 1 failed and at least 2 more (%d entries in pages of 100)",
			claims.hits.Load(), claims.seen.Load(), dead)
	}
	if !b.logged("took over pending entries") {
		t.Errorf("the takeover is not logged:\n%s", b.log.String())
	}
}

// failedOnce holds the messages (run/i) whose first attempt safety.fifth failed.
var failedOnce sync.Map

func init() {
	// safety.fifth fails the first attempt at every fifth message of a run (field i divisible by 5).
	stages.Register("safety.fifth", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		if i, ok := m.Value["i"].(json.Number); ok {
			if n, err := i.Int64(); err == nil && n%5 == 0 {
				if _, failed := failedOnce.LoadOrStore(fmt.Sprint(m.Value["run"], "/", n), true); !failed {
					return nil, errors.New("the first attempt at every fifth message fails")
				}
			}
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
}

// TestDueRetriesWaitThroughFailedClaims: failed messages wait in their partitions' retry sets, and
// taking the due ones (ClaimRetries) fails for a while, as when the connection drops. The messages
// wait in Redis meanwhile; once the claims work, every one is processed, once, and the job ends.
func TestDueRetriesWaitThroughFailedClaims(t *testing.T) {
	const n = 100
	ctx := context.Background()
	c := server.open(t)
	plan := buildSource(t, `
pipeline "retries" {}
retry "soon" {
  max_attempts = 3
  initial      = "50ms"
  max          = "50ms"
}
topic "in" {
  partitions = 2
  key        = msg.k
}
topic "out" {}
stage "work" {
  kind   = "go"
  func   = "safety.fifth"
  input  = topic.in
  output = topic.out
  retry  = retry.soon
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
`)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	retrySets := []string{keys.Retry("in", 0, "work"), keys.Retry("in", 1, "work")}
	out := keys.Stream("out", 0)
	run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
	publishKeyed(t, c, plan, run, 0, n)
	scheduled := func() (total int64) {
		for _, k := range retrySets {
			m, err := c.ScheduledRetries(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			total += m
		}
		return total
	}

	rc := server.open(t)
	claims := inject(rc, errInjected, func(cmd goredis.Cmder) bool {
		return scriptOn(retrySets[0])(cmd) || scriptOn(retrySets[1])(cmd)
	})
	claims.arm(math.MaxInt64)
	job := runInBackground(t, plan, runtime.Options{Redis: rc, Nodes: []string{"work"}, UntilDrained: true,
		RetryInPlaceUpTo: time.Millisecond}) // every retry waits in the retry set
	waitFor(t, "the failed messages to wait in the retry sets while claims fail", func() bool {
		return claims.hits.Load() >= 4 && scheduled() == n/5 && len(arrivals(t, c, out)) == n-n/5
	})
	for i := range arrivals(t, c, out) {
		if i%5 == 0 {
			t.Errorf("message %d arrived while its retry could not be claimed", i)
		}
	}
	claims.disarm()
	if err := job.wait(t); err != nil {
		t.Fatalf("%v\n%s", err, job.log.String())
	}
	if dups := tally(t, arrivals(t, c, out), n); dups != 0 {
		t.Errorf("%d messages processed twice", dups)
	}
	if left := scheduled(); left != 0 {
		t.Errorf("%d retries left in the retry sets", left)
	}
	s := nodeCounts(job.summary.Nodes, "work")
	if s.Retries != n/5 || s.DeadLettered != 0 {
		t.Errorf("%d retried and %d dead-lettered, want %d and 0", s.Retries, s.DeadLettered, n/5)
	}
}

// TestOutputOfAnotherTypeEndsTheRun: the stream a stage writes to is a key of another type
// (another application's). Found at start, it ends the run before anything is read. Created while
// the run goes, the XADD of the stage's next commit fails inside the transaction that would ack its
// inputs: the ack sees that the output is not a stream and acks nothing, and the run ends at once
// with an error that names the key. Nothing is lost: the messages wait, unacknowledged, for the
// key to be a stream again.
func TestOutputOfAnotherTypeEndsTheRun(t *testing.T) {
	const n = 10
	ctx := context.Background()
	for _, when := range []string{"at start", "while running", "while running, effectively-once"} {
		t.Run(when, func(t *testing.T) {
			c := server.open(t)
			delivery := "at_least_once"
			if strings.HasSuffix(when, "effectively-once") {
				// One script that writes and acks (redis.Commit): it finds the key first.
				delivery = "effectively_once"
			}
			plan := buildTestdata(t, "copy.hcl", "delivery="+delivery)
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			in, out := keys.Stream("in", 0), keys.Stream("out", 0)
			takeOut := func() {
				t.Helper()
				if err := c.Universal().Set(ctx, out, "another application's value", 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if when == "at start" {
				takeOut()
				publishNumbered(t, c, plan, 0, n)
			}
			// While running, a service: a job whose input is still empty is done at once, before the
			// test writes it.
			job := runInBackground(t, plan, runtime.Options{Redis: c, Nodes: []string{"work"}, UntilDrained: when == "at start"})
			if when != "at start" {
				waitFor(t, "the stage to read its input", func() bool {
					st, err := c.StreamStats(ctx, in)
					return err == nil && len(st.Groups) == 1
				})
				takeOut()
				publishNumbered(t, c, plan, 0, n)
			}
			err := job.wait(t)
			if v, err := c.Universal().Get(ctx, out).Result(); err != nil || v != "another application's value" {
				t.Errorf("the other application's key holds %q (%v)", v, err)
			}
			left := unackedOf(t, c, in, "work")
			t.Logf("the run ended with: %v; %d of %d messages left unacknowledged", err, left, n)
			if when == "at start" {
				if err == nil || !strings.Contains(err.Error(), out) || !strings.Contains(err.Error(), "holds a string, not a stream") {
					t.Fatalf("the run ended with %v, want the type of %s named at start\n%s", err, out, job.log.String())
				}
				if left != n {
					t.Errorf("%d of %d messages unacknowledged, want all: the run read before it checked", left, n)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), out) ||
				!strings.Contains(err.Error(), "nothing was acked") || !strings.Contains(err.Error(), "stage work") {
				t.Fatalf("the run ended with %v, want the WRONGTYPE of %s, saying that nothing was acked\n%s", err, out, job.log.String())
			}
			if left != n {
				t.Errorf("%d of %d messages unacknowledged, want all: inputs were acked without their outputs", left, n)
			}
		})
	}
}

// scriptFailer makes Redis fail the script calls of transactions whose first key is key, and the
// script calls outside transactions that have key among their keys (the effectively-once commit
// of a single server): while armed, such a call runs a script that fails instead, as a script does
// that meets maxmemory or a key of another type.
type scriptFailer struct {
	key   string
	armed atomic.Bool
	hits  atomic.Int64
}

func (f *scriptFailer) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (f *scriptFailer) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, c goredis.Cmder) error {
		if args := c.Args(); f.armed.Load() && (c.Name() == "eval" || c.Name() == "evalsha") && len(args) > 3 &&
			slices.Contains(args[3:], any(f.key)) {
			args[0], args[1] = "eval", "return redis.error_reply('ERR injected failure of the script')"
			f.hits.Add(1)
		}
		return next(ctx, c)
	}
}

func (f *scriptFailer) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, c := range cmds {
			if args := c.Args(); f.armed.Load() && c.Name() == "eval" && len(args) > 3 && args[3] == f.key {
				args[1] = "return redis.error_reply('ERR injected failure of the script')"
				f.hits.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestEffectivelyOnceScriptFailing: the script that writes a stage's effectively-once outputs
// fails: on a single server the script that also acks the inputs, on a cluster the marker script
// before the acks. Nothing may be acknowledged: the batch is processed again, and once the script
// works, each output is written once.
func TestEffectivelyOnceScriptFailing(t *testing.T) {
	const n = 10
	t.Run("until it works again", func(t *testing.T) {
		c := server.open(t)
		plan := buildTestdata(t, "copy.hcl", "delivery=effectively_once")
		keys := redis.Keys{Prefix: plan.KeyPrefix}
		in, out := keys.Stream("in", 0), keys.Stream("out", 0)
		publishNumbered(t, c, plan, 0, n)
		rc := server.open(t)
		f := &scriptFailer{key: out}
		f.armed.Store(true)
		rc.Universal().AddHook(f)
		run := runInBackground(t, plan, runtime.Options{Redis: rc, Nodes: []string{"work"}})
		waitFor(t, "the script to fail three times (the batch processed again and failing again), or an ack", func() bool {
			return f.hits.Load() >= 3 || unackedOf(t, c, in, "work") < n
		})
		if left := unackedOf(t, c, in, "work"); left != n {
			t.Fatalf("%d of %d messages unacknowledged while their outputs fail: the others were acked without them", left, n)
		}
		if l := lengthOf(t, c, out); l != 0 {
			t.Errorf("%d outputs written by the failing script", l)
		}
		f.armed.Store(false)
		waitFor(t, "every output to be written and its input acknowledged", func() bool {
			return len(arrivals(t, c, out)) == n && unackedOf(t, c, in, "work") == 0
		})
		if err := run.stop(); err != nil {
			t.Fatalf("%v\n%s", err, run.log.String())
		}
		if dups := tally(t, arrivals(t, c, out), n); dups != 0 {
			t.Errorf("%d outputs written twice", dups)
		}
	})
	t.Run("halfway", func(t *testing.T) {
		// On a cluster, where the outputs have markers, a marker's key holds another type of key:
		// the script writes the outputs before it, then fails (WRONGTYPE, which ends the run).
		// Nothing is acked; once the key is gone, the next run writes the other outputs, and none
		// twice. (A single server writes no markers: TestOutputOfAnotherTypeEndsTheRun.)
		ctx := context.Background()
		c := cluster.open(t)
		plan := buildTestdata(t, "copy.hcl", "delivery=effectively_once")
		keys := redis.Keys{Prefix: plan.KeyPrefix}
		in, out := keys.Stream("in", 0), keys.Stream("out", 0)
		publishNumbered(t, c, plan, 0, n)
		entries, err := c.Universal().XRange(ctx, in, "-", "+").Result()
		if err != nil || len(entries) != n {
			t.Fatalf("%d entries (%v)", len(entries), err)
		}
		bad := keys.Dedup("out", 0, "work", "in", 0, entries[n/2].ID, 0)
		if err := c.Universal().HSet(ctx, bad, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		job := runInBackground(t, plan, runtime.Options{Redis: c, Nodes: []string{"work"}, UntilDrained: true})
		err = job.wait(t)
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("the run ended with %v, want WRONGTYPE\n%s", err, job.log.String())
		}
		if left := unackedOf(t, c, in, "work"); left != n {
			t.Fatalf("%d of %d messages unacknowledged: the others were acked without their outputs", left, n)
		}
		if l := lengthOf(t, c, out); l != n/2 {
			t.Errorf("%d outputs written before the failure, want %d", l, n/2)
		}
		if err := c.Universal().Del(ctx, bad).Err(); err != nil {
			t.Fatal(err)
		}
		runJob(t, c, plan, runtime.Options{Nodes: []string{"work"}})
		if dups := tally(t, arrivals(t, c, out), n); dups != 0 {
			t.Errorf("%d outputs written twice", dups)
		}
	})
}
