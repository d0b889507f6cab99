package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A stateful stage processes its next batch while the batch before commits, reading that batch's
// state writes before Redis has them. When the commit then fails, whether Redis applied it or not,
// the batch processed over it is given up and processed again from what Redis holds: every running
// total is exact and every message comes out once. A hook on the runner's connection holds the
// stage's third commit's reply until the next batch reads its state, then fails it: unsent
// (nothing applied), or sent (applied, its reply lost).
func TestAFailedCommitGivesUpTheBatchProcessedOverIt(t *testing.T) {
	for _, applied := range []bool{false, true} {
		name := map[bool]string{false: "not applied", true: "applied, reply lost"}[applied]
		t.Run(name, func(t *testing.T) {
			const n, keys = 200, 13 // a batch of 10 reads some keys the batch before wrote, and some not
			ctx := context.Background()
			srv := redistest.Start(t)
			c := openURLs(t, srv.URL())
			run := fmt.Sprintf("overlap-%d", prefixes.Add(1))
			plan := buildSource(t, `
pipeline "overlap" {}
topic "in" {
  partitions = 1
  key        = msg.key
}
topic "out" {}
stage "total" {
  kind   = "go"
  func   = "test.running_total"
  input  = topic.in
  output = topic.out
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
`)
			pub, err := runtime.NewPublisher(c, plan)
			if err != nil {
				t.Fatal(err)
			}
			want := map[int]int64{} // message -> its key's total with it
			totals := map[string]int64{}
			for i := range n {
				key := "k" + strconv.Itoa(i%keys)
				totals[key]++
				want[i] = totals[key]
				msg := fmt.Sprintf(`{"run":%q,"key":%q,"i":%d,"n":1}`, run, key, i)
				if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(msg), nil)); err != nil {
					t.Fatal(err)
				}
			}
			if err := pub.Close(ctx); err != nil {
				t.Fatal(err)
			}

			runner := openURLs(t, srv.URL())
			hook := &failCommit{state: redis.Keys{Prefix: plan.KeyPrefix}.State("in", 0, "total"), nth: 3,
				applied: applied, read: make(chan struct{})}
			runner.Universal().AddHook(hook)
			j := runJob(t, runner, plan, runtime.Options{BatchSize: 10})

			if !hook.failed {
				t.Fatal("no commit of the stage was failed")
			}
			if hook.notOverlapped {
				t.Fatal("the next batch did not read its state while the batch before committed")
			}
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
			state, err := c.Universal().HGetAll(ctx, hook.state).Result()
			if err != nil {
				t.Fatal(err)
			}
			for key, total := range totals {
				if state[key] != strconv.FormatInt(total, 10) {
					t.Errorf("the state holds %s = %q, want %d", key, state[key], total)
				}
			}
			if !strings.Contains(j.log, "committing a batch failed") {
				t.Errorf("the log does not say that a commit failed:\n%s", j.log)
			}
		})
	}
}

// failCommit is a hook on the runner's connection that fails the stage's nth commit (a call that
// writes its state hash) once the next batch has read the state: unsent, or (applied) sent at once
// and its reply lost.
type failCommit struct {
	state   string // the stage's state hash
	nth     int
	applied bool
	read    chan struct{} // closed at the first read of the state while the nth commit is held

	mu            sync.Mutex
	commits       int
	holding       bool
	failed        bool
	notOverlapped bool // the next batch read nothing while the commit was held
}

func (h *failCommit) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *failCommit) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if h.touchesState(cmd) && isStateRead(cmd) {
			h.sawRead()
		}
		if h.isCommit([]goredis.Cmder{cmd}) {
			return h.commit(ctx, []goredis.Cmder{cmd}, func() error { return next(ctx, cmd) })
		}
		return next(ctx, cmd)
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

// commit sends a commit, failing the nth as the hook says.
func (h *failCommit) commit(ctx context.Context, cmds []goredis.Cmder, send func() error) error {
	h.mu.Lock()
	h.commits++
	fail := h.commits == h.nth
	h.holding = fail
	h.mu.Unlock()
	if !fail {
		return send()
	}
	if h.applied {
		// Sent at once: held, a transaction's WATCH would see the sink's reads and abort it.
		if err := send(); err != nil {
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
	h.mu.Lock()
	h.holding, h.failed = false, true
	h.mu.Unlock()
	return err
}

func (h *failCommit) sawRead() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holding {
		h.holding = false
		close(h.read)
	}
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
		state = state || h.touchesState(cmd)
	}
	return names && state
}

func (h *failCommit) touchesState(cmd goredis.Cmder) bool {
	for _, arg := range cmd.Args() {
		if s, ok := arg.(string); ok && s == h.state {
			return true
		}
	}
	return false
}

// isStateRead reports whether cmd reads a key's total (k0 to k12): a batch's own read, where the
// runtime's reads of the state hash name its own fields.
func isStateRead(cmd goredis.Cmder) bool {
	if name := cmd.Name(); name != "hget" && name != "hmget" {
		return false
	}
	for _, arg := range cmd.Args()[2:] {
		if s, ok := arg.(string); ok && strings.HasPrefix(s, "k") {
			return true
		}
	}
	return false
}
