package redis

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A blocking XREADGROUP waits by the server's wall clock, and a process blocked in one looks the same
// from outside as a process at work. A test that runs a pipeline on a virtual clock needs neither:
// WithClockedReads makes the reads of a client wait on the client's clock instead, woken by the
// client's own writes, and counts the commands waiting for a reply, so that the test can tell when
// everything is idle and time may move on.

// clockedReads is what the clients made from one WithClockedReads share.
type clockedReads struct {
	mu       sync.Mutex
	watchers map[string]chan struct{} // closed when the key is written
	inFlight atomic.Int64
}

// WithClockedReads returns a client on the same connections whose group reads never block in
// Redis: a read with nothing to return waits on the client's clock (WithClock) for its Block
// duration, or until a client made from this one writes to the stream (XADD, or a script that has
// the stream among its keys), and then reads again. Writes by other clients are seen when the wait
// ends. It hooks the connections: call it once, on a client that a test owns.
func (c *Client) WithClockedReads() *Client {
	clocked := *c
	clocked.clocked = &clockedReads{watchers: map[string]chan struct{}{}}
	c.rdb.AddHook(clocked.clocked)
	return &clocked
}

// InFlight returns the number of commands sent by a client made with WithClockedReads (or from
// it) that have not had their reply yet; 0 for other clients.
func (c *Client) InFlight() int64 {
	if c.clocked == nil {
		return 0
	}
	return c.clocked.inFlight.Load()
}

// clockedRead is a group read of a clocked client: see WithClockedReads.
func (c *Client) clockedRead(ctx context.Context, a ReadArgs, id string, block time.Duration) (Batch, error) {
	for {
		written := c.clocked.watch(a.Stream)
		b, err := c.readGroupOnce(ctx, a, id, -1)
		if err != nil || b.Len() > 0 {
			return b, err
		}
		t := c.newTimer(block)
		select {
		case <-written:
			t.Stop()
		case <-t.C():
			return Batch{}, nil
		case <-ctx.Done():
			t.Stop()
			return Batch{}, wrap(ctx.Err(), "reading group "+a.Group+" of", a.Stream)
		}
	}
}

// watch returns a channel that is closed when key is next written.
func (r *clockedReads) watch(key string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.watchers[key]
	if !ok {
		ch = make(chan struct{})
		r.watchers[key] = ch
	}
	return ch
}

// written wakes the readers waiting for the keys that cmd may have written.
func (r *clockedReads) written(cmd goredis.Cmder) {
	args := cmd.Args()
	var keys []any
	switch strings.ToLower(cmd.Name()) {
	case "xadd":
		if len(args) > 1 {
			keys = args[1:2]
		}
	case "eval", "evalsha", "fcall":
		if len(args) > 2 {
			n, err := strconv.Atoi(toString(args[2]))
			if err == nil && n >= 0 && 3+n <= len(args) {
				keys = args[3 : 3+n]
			}
		}
	}
	if len(keys) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		key := toString(k)
		if ch, ok := r.watchers[key]; ok {
			close(ch)
			delete(r.watchers, key)
		}
	}
}

func (r *clockedReads) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *clockedReads) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		r.inFlight.Add(1)
		defer r.inFlight.Add(-1)
		err := next(ctx, cmd)
		r.written(cmd)
		return err
	}
}

func (r *clockedReads) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		r.inFlight.Add(1)
		defer r.inFlight.Add(-1)
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			r.written(cmd)
		}
		return err
	}
}
