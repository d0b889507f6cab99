package runtime_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestASourceWhoseLeaseExpiredGoesOn: a process that stalls past its lease's TTL finds its source's
// write refused (the lease it wrote under expired).
//   - Nobody else took the lease: the process takes it again and writes the same batch under the new
//     one; its source goes on where it was, without reading the file again.
//   - Another process took it and died (its lease expires soon after): the source stops, and the
//     process waits to take the lease back, then resumes from the last checkpoint.
//
// Before, the source stopped in both cases while the process kept the lease or stopped asking for
// it, and nobody ran the source again: the job never ended.
func TestASourceWhoseLeaseExpiredGoesOn(t *testing.T) {
	for _, b := range []backend{server, cluster} {
		for _, taken := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/taken=%v", b.name, taken), func(t *testing.T) { sourceLeaseExpires(t, b, taken) })
		}
	}
}

func sourceLeaseExpires(t *testing.T, b backend, taken bool) {
	const n, batch = 30, 4
	plan := linesToStdout(t, "expiring", n)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	c := b.open(t)
	expire := &leaseExpirer{position: keys.SourcePosition("lines"), lease: keys.SourceLease("lines"), at: 3, taken: taken, admin: b.open(t)}
	c.Universal().AddHook(expire)
	j := runJob(t, c, plan, runtime.Options{BatchSize: batch})
	if expire.done.Load() == 0 {
		t.Fatal("the lease was never expired under the source")
	}
	if expire.foreign.Load() {
		t.Fatal("the process never tried to take the lease that another process held")
	}
	retaken := strings.Contains(j.log, "source lease expired and was taken again")
	resumed := strings.Contains(j.log, "resuming where the source stopped")
	if retaken == taken || resumed != taken {
		t.Errorf("the lease taken again at once: %v, the source resumed from its checkpoint: %v; want %v and %v\n%s",
			retaken, resumed, !taken, taken, j.log)
	}
	if l := totalLength(t, c, keys.Streams("in", 3)); l != n {
		t.Errorf("the topic holds %d entries, want %d", l, n)
	}
	if got := len(jsonLines(t, j.stdout)); got != n {
		t.Errorf("the sink printed %d messages, want %d", got, n)
	}
}

// leaseExpirer deletes a source's lease, as its expiry would, just before the at-th script that
// records the source's position runs; if taken, another process holds it then, until this process
// has tried to take it and been refused (that process died: its lease expires). The other process's
// lease goes on that event, not after a time, which a loaded machine could outlast before the
// refusal.
type leaseExpirer struct {
	position, lease string
	at              int64
	taken           bool
	admin           *redis.Client
	seen, done      atomic.Int64
	foreign         atomic.Bool // another process holds the lease
}

func (e *leaseExpirer) before(ctx context.Context, c goredis.Cmder) {
	args := c.Args()
	if (c.Name() != "eval" && c.Name() != "evalsha") || len(args) < 4 || !slices.Contains(args[3:], any(e.position)) {
		return
	}
	if e.seen.Add(1) != e.at {
		return
	}
	// One command either way: between a DEL and a SET, this process's renewal could take the
	// free lease again before the other process's SET overwrote it.
	var err error
	if e.taken {
		err = e.admin.Universal().Set(ctx, e.lease, "another-process#1", time.Minute).Err()
		e.foreign.Store(err == nil)
	} else {
		err = e.admin.Universal().Del(ctx, e.lease).Err()
	}
	if err == nil {
		e.done.Add(1)
	}
}

// after ends the other process's lease once this process was refused it: an attempt to acquire
// the lease (the script's keys are the lease and its fence) answered without an error.
func (e *leaseExpirer) after(ctx context.Context, c goredis.Cmder) {
	args := c.Args()
	if !e.foreign.Load() || c.Err() != nil || (c.Name() != "eval" && c.Name() != "evalsha") || len(args) < 5 ||
		args[3] != any(e.lease) || args[4] != any(redis.LeaseFence(e.lease)) {
		return
	}
	if e.foreign.CompareAndSwap(true, false) {
		if err := e.admin.Universal().Del(ctx, e.lease).Err(); err != nil {
			panic(err) // the run would wait for the lease until the test's timeout
		}
	}
}

func (e *leaseExpirer) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (e *leaseExpirer) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, c goredis.Cmder) error {
		e.before(ctx, c)
		err := next(ctx, c)
		e.after(ctx, c)
		return err
	}
}

func (e *leaseExpirer) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, c := range cmds {
			e.before(ctx, c)
		}
		err := next(ctx, cmds)
		for _, c := range cmds {
			e.after(ctx, c)
		}
		return err
	}
}
