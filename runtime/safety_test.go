package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The safety paths: what the runtime does when a step that guards a message fails. A sink's flush
// fails, a lease moves to another process (taken from a source, lost at renewal, given up when a
// process joins), a consumer dies with entries pending on a partition without leases, a commit's
// writes fail inside the transaction that acks. Faults are injected from outside the product: a
// go-redis hook on the runtime's client fails the commands a test picks, the test takes a lease
// itself, or a writer fails while the test says so.

// running is a pipeline run in the background.
type running struct {
	rt      *runtime.Runtime
	log     *syncBuffer
	cancel  context.CancelFunc
	done    chan struct{}
	summary *runtime.Summary
	err     error
}

// start runs a plan in the background (as a service unless opts.UntilDrained) until stop, or until
// the test ends. The deadline only keeps a broken test from hanging.
func start(t *testing.T, plan *flow.Plan, opts runtime.Options) *running {
	t.Helper()
	r := &running{log: &syncBuffer{}, done: make(chan struct{})}
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
func (r *running) stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// wait waits for a job to end by itself and returns its error.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	<-r.done
	if errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("the run did not end:\n%s", r.log.String())
	}
	return r.err
}

// logged reports whether the run's log has a line containing s.
func (r *running) logged(s string) bool { return strings.Contains(r.log.String(), s) }

// unacked returns the entries of a stream that a group has not acknowledged: pending, or not yet
// delivered (all of them before the group exists).
func unacked(t *testing.T, c *redis.Client, stream, group string) int64 {
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

// pendingOf returns how many entries of a stream are pending for a group.
func pendingOf(t *testing.T, c *redis.Client, stream, group string) int64 {
	t.Helper()
	p, err := c.Universal().XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// streamLen returns a stream's length.
func streamLen(t *testing.T, c *redis.Client, stream string) int64 {
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

// named matches commands by name (lower case, as go-redis names them).
func named(names ...string) func(goredis.Cmder) bool {
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
		return unacked(t, c, keys.Stream("in", 0), "out") + unacked(t, c, keys.Stream("in", 1), "out")
	}
	w := &failingWriter{failing: true}
	run := start(t, plan, runtime.Options{Redis: c, Stdout: w})
	waitFor(t, "the flush to fail three times: the batch delivered again and failing again", func() bool {
		return w.failures() >= 3
	})
	if b := backlog(); b != n {
		t.Errorf("%d of %d messages unacknowledged while the output fails: a batch was acknowledged that was not out", b, n)
	}
	if !run.logged("the batch will be delivered again") {
		t.Errorf("the failed flush is not logged:\n%s", run.log.String())
	}
	failures := w.failures()
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
	t.Logf("%d failed flushes; %d messages written, %d of them again", failures, n+dups, dups)
	if dups > failures*n {
		t.Errorf("%d duplicates after %d failed flushes of at most %d messages", dups, failures, n)
	}
	if dead := streamLen(t, c, keys.DeadLetter("out")); dead != 0 {
		t.Errorf("%d messages dead-lettered", dead)
	}
}

var _ = math.MaxInt64
