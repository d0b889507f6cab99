package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A stateful stage processes its next batch while the batch before commits, reading that batch's
// state writes before Redis has them. When the commit then fails, whether Redis applied it or not,
// the batch processed over it is given up and processed again from what Redis holds: every running
// total is exact and every message comes out once. A hook on the runner's connection holds the
// stage's third commit's reply until the next batch reads its state from Redis, then fails it:
// unsent (nothing applied), or sent (applied, its reply lost).
func TestAFailedCommitGivesUpTheBatchProcessedOverIt(t *testing.T) {
	const n = 200
	want := map[int]int64{} // message -> its key's total with it
	totals := map[string]int64{}
	var msgs []string
	for i := range n {
		// Four messages a key: a batch of 10 reads a key the batch before wrote, and keys it is
		// the first to read, which the owner knows the state does not hold yet (state.HeldKeys).
		// Message 32, of the fourth batch, is of k0 again, which only the first batch wrote:
		// that batch reads it from Redis, the signal that it runs over the third's commit.
		key := "k" + strconv.Itoa(i/4)
		if i == 32 {
			key = "k0"
		}
		totals[key]++
		want[i] = totals[key]
		msgs = append(msgs, fmt.Sprintf(`{"key":%q,"i":%d,"n":1}`, key, i))
	}
	for _, applied := range []bool{false, true} {
		t.Run(map[bool]string{false: "not applied", true: "applied, reply lost"}[applied], func(t *testing.T) {
			j, state := runWithAFailedCommit(t, applied, "test.running_total", "", `"i":29,`, msgs)
			got := map[int][]int64{}
			for _, line := range strings.Split(strings.TrimSpace(j.stdout), "\n") {
				var m struct {
					I     int   `json:"i"`
					Total int64 `json:"total"`
				}
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				got[m.I] = append(got[m.I], m.Total)
			}
			for i := range n {
				if !slices.Equal(got[i], []int64{want[i]}) {
					t.Errorf("message %d came out with totals %v, want once with %d", i, got[i], want[i])
				}
			}
			for key, total := range totals {
				if state[key] != strconv.FormatInt(total, 10) {
					t.Errorf("the state holds %s = %q, want %d", key, state[key], total)
				}
			}
		})
	}
}

// The same for a stage with timers and a watermark (test.minutes_at_end counts each key's messages
// per minute of event time): the batch processed over the failed commit started from the
// watermark that commit would have written, which goes back with it. Were it kept, the batch
// before, processed again, would find its own messages of an earlier minute late.
func TestAFailedCommitTakesTheWatermarkBack(t *testing.T) {
	// Messages 5s of event time apart, the keys in turn: a batch of 10 spans 50s. The third batch
	// (100s to 145s) spans the minute that ends at 120s and the next: it is the first to write
	// k11@180000 (message 24's window). The fourth's windows are the third's or new ones, which
	// the owner knows the state does not hold (state.HeldKeys): it reads the timers due (those of
	// the minute that ends at 180s), the signal that it runs over the third's commit.
	const n, keys, step = 200, 13, 5000
	want := map[string]int{}
	var msgs []string
	for i := range n {
		key, at := "k"+strconv.Itoa(i%keys), int64(i)*step
		want[fmt.Sprintf("%s@%d", key, at-at%60_000+60_000)]++
		msgs = append(msgs, fmt.Sprintf(`{"key":%q,"i":%d,"at":%d}`, key, i, at))
	}
	for _, applied := range []bool{false, true} {
		t.Run(map[bool]string{false: "not applied", true: "applied, reply lost"}[applied], func(t *testing.T) {
			j, _ := runWithAFailedCommit(t, applied, "test.minutes_at_end", "event_time = msg.at", "k11@180000", msgs)
			got := map[string]int{}
			for _, line := range strings.Split(strings.TrimSpace(j.stdout), "\n") {
				var m struct {
					Key   string `json:"key"`
					End   int64  `json:"end"`
					Count int    `json:"count"`
				}
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				window := fmt.Sprintf("%s@%d", m.Key, m.End)
				if _, twice := got[window]; twice {
					t.Errorf("%s reported twice", window)
				}
				got[window] = m.Count
			}
			if !maps.Equal(got, want) {
				t.Errorf("reported %v\nwant %v", got, want)
			}
			if s := j.node(t, "s"); s.Late != 0 {
				t.Errorf("%d messages found late, want none: %+v", s.Late, s)
			}
		})
	}
}

// runWithAFailedCommit runs a job of a stage of fn over msgs, in batches of 10, failing the commit
// of its third batch (messages 20 to 29, the first to write target) once the fourth batch has read
// the stage's state or timers from Redis (failCommit), and returns the job and the stage's state as
// the job left it.
func runWithAFailedCommit(t *testing.T, applied bool, fn, attrs, target string, msgs []string) (job, map[string]string) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.Start(t)
	c := openURLs(t, srv.URL())
	plan := buildSource(t, `
pipeline "overlap" {}
topic "in" {
  partitions = 1
  key        = msg.key
}
topic "out" {}
stage "s" {
  kind   = "go"
  func   = "`+fn+`"
  input  = topic.in
  output = topic.out
  `+attrs+`
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
`)
	publishAll(t, c, plan, "in", msgs)
	runner := openURLs(t, srv.URL())
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	hook := newFailCommit(keys.State("in", 0, "s"), keys.Timers("in", 0, "s"), target, applied)
	runner.Universal().AddHook(hook)
	j := runJob(t, runner, plan, runtime.Options{BatchSize: 10})
	if !hook.failed {
		t.Fatal("no commit of the stage was failed")
	}
	if hook.notOverlapped {
		t.Fatal("the next batch did not read its state while the batch before committed")
	}
	if !strings.Contains(j.log, "committing a batch failed") {
		t.Errorf("the log does not say that a commit failed:\n%s", j.log)
	}
	state, err := c.Universal().HGetAll(ctx, hook.state).Result()
	if err != nil {
		t.Fatal(err)
	}
	return j, state
}

// failCommit is a hook on the runner's connection that fails the stage's first commit that writes
// target (in an output or a state key), once the next batch, processed meanwhile, has read the
// stage's state or timers (after the stage's fourth read of its input, the batch after the
// target's): unsent, or (applied) sent at once and its reply lost.
type failCommit struct {
	state, timers string // the stage's state hash and timer set
	target        []byte // what the failed commit writes first
	applied       bool
	read          chan struct{} // closed when the state is read while the commit is held
	readOnce      sync.Once

	mu            sync.Mutex
	reads         int // of the stage's input (XREADGROUP) so far
	failed        bool
	notOverlapped bool // the next batch read nothing while the commit was held
}

func newFailCommit(state, timers, target string, applied bool) *failCommit {
	return &failCommit{state: state, timers: timers, target: []byte(target), applied: applied, read: make(chan struct{})}
}

func (h *failCommit) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *failCommit) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if h.fourthRead() && h.readsState(cmd) {
			h.readOnce.Do(func() { close(h.read) })
		}
		if h.isCommit([]goredis.Cmder{cmd}) {
			return h.commit(ctx, []goredis.Cmder{cmd}, func() error { return next(ctx, cmd) })
		}
		err := next(ctx, cmd)
		if args := cmd.Args(); err == nil && cmd.Name() == "xreadgroup" && len(args) > 2 && args[2] == any("s") {
			h.mu.Lock()
			h.reads++
			h.mu.Unlock()
		}
		return err
	}
}

func (h *failCommit) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if h.isCommit(cmds) {
			return h.commit(ctx, cmds, func() error { return next(ctx, cmds) })
		}
		return next(ctx, cmds)
	}
}

// commit sends a commit, failing the target's as the hook says.
func (h *failCommit) commit(ctx context.Context, cmds []goredis.Cmder, send func() error) error {
	h.mu.Lock()
	fail := !h.failed && h.writes(cmds)
	h.failed = h.failed || fail
	h.mu.Unlock()
	if !fail {
		return send()
	}
	if h.applied {
		// Sent at once: held, a transaction's WATCH would see the sink's reads and abort it.
		if err := send(); err != nil {
			// Not applied (a script not loaded yet, whose EVAL follows): the next call is the one.
			h.mu.Lock()
			h.failed = false
			h.mu.Unlock()
			return err
		}
	}
	timer := time.NewTimer(30 * time.Second) // only keeps a broken runtime from hanging the test
	defer timer.Stop()
	select {
	case <-h.read:
	case <-timer.C:
		h.mu.Lock()
		h.notOverlapped = true
		h.mu.Unlock()
	}
	err := fmt.Errorf("the test failed the commit: %w", syscall.ECONNRESET)
	for _, cmd := range cmds {
		cmd.SetErr(err)
	}
	return err
}

// writes reports whether cmds write the target's output.
func (h *failCommit) writes(cmds []goredis.Cmder) bool {
	for _, cmd := range cmds {
		for _, arg := range cmd.Args() {
			switch v := arg.(type) {
			case []byte:
				if bytes.Contains(v, h.target) {
					return true
				}
			case string:
				if strings.Contains(v, string(h.target)) {
					return true
				}
			case *string:
				if strings.Contains(*v, string(h.target)) {
					return true
				}
			}
		}
	}
	return false
}

// isCommit reports whether cmds are a commit of the stage: a transaction or script that names its
// state hash.
func (h *failCommit) isCommit(cmds []goredis.Cmder) bool {
	names, state := false, false
	for _, cmd := range cmds {
		switch cmd.Name() {
		case "exec", "evalsha", "eval":
			names = true
		}
		state = state || slices.Contains(cmd.Args(), any(h.state))
	}
	return names && state
}

// fourthRead reports whether the stage's fourth read of its input returned (the batch after the
// target's, read while the target's commit is sent): what reads the stage's state then is that
// batch, until the commit fails.
func (h *failCommit) fourthRead() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reads >= 4
}

// readsState reports whether cmd reads the stage's state (a key of its own, not the runtime's
// fields, such as the watermark the run reads to tell whether it is drained) or its timers.
func (h *failCommit) readsState(cmd goredis.Cmder) bool {
	args := cmd.Args()
	switch cmd.Name() {
	case "hget", "hmget":
		return len(args) > 2 && args[1] == any(h.state) && slices.ContainsFunc(args[2:], func(field any) bool {
			s, ok := field.(string)
			return ok && !strings.HasPrefix(s, "\x00")
		})
	case "zrangebyscore", "zrange":
		return len(args) > 1 && args[1] == any(h.timers)
	}
	return false
}
