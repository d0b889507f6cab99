package redis

import (
	"context"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// A stateless unit's commit on a single server (outputs and acks, fenced by the lease) is fenced
// with WATCH instead of the settle script when it can be: the script received every input's ID
// as an argument, and an ID that passes through Lua (an argument made a Lua string, then a Redis
// string again for XACK) cost Redis more than the XACK itself, about 0.4 us per message at every
// hop.
//
// commitWatched first watches the lease and the output streams and reads them (one round trip),
// then, if the lease holds the commit's value and no output's key holds another type, sends the
// transaction with a plain XACK. EXEC runs nothing if any watched key changed since (the lease
// renewed, lost or expired, which aborts EXEC since Redis 6.0.9; an output stream written by
// another writer, deleted or replaced): what it runs is what the script would have checked. Whenever anything is not as expected, the
// commit goes through the settle script (commitAtomic) instead, which decides and reports as
// before.

// watchable reports whether commitWatched can make a commit: a single server, a lease, acks and
// nothing else to settle, plain outputs only (no markers, no payloads under their own keys, whose
// scripts can fail inside EXEC), and no output stream whose watched commits were aborted lately
// (see watchedStreams).
func (c *Client) watchable(a CommitArgs, p *commitPlan) bool {
	if c.watched == nil || a.Lease == nil || len(a.IDs) == 0 || a.Checkpoint != nil ||
		len(a.RetryDone)+len(a.Retries) > 0 || !a.State.empty() || len(p.order)+len(p.guards) > 0 {
		return false
	}
	for _, o := range p.plain {
		if o.off != nil {
			return false
		}
	}
	return !c.watched.busy(p.streams)
}

// commitWatched makes a commit that watchable accepts (see above). A commit aborted once is tried
// again at once (a renewal of the lease aborts it, and the next try finds the lease renewed); one
// aborted twice goes through the settle script, as do the next commits to its streams for a while.
func (c *Client) commitWatched(ctx context.Context, a CommitArgs, p *commitPlan) ([]string, error) {
	conn := c.watched.rdb.Conn()
	defer func() { _ = conn.Close() }()
	for range 2 {
		if ok, err := watchCommit(ctx, conn, a, p); !ok {
			if err != nil && strings.HasPrefix(errText(err), "NOPERM") {
				c.watched.refused() // the user may not WATCH: see docs/running.md
			}
			// The settle script finds what is wrong (a lost lease, a key of another type) and
			// says so.
			_ = conn.Process(ctx, goredis.NewStatusCmd(ctx, "unwatch"))
			return c.commitAtomic(ctx, a, p)
		}
		if beforeWatchedExec != nil {
			beforeWatchedExec()
		}
		ids, aborted, err := p.commitTx(ctx, conn.TxPipeline(), a, func(pipe goredis.Pipeliner) goredis.Cmder {
			return queueXAck(ctx, pipe, a)
		})
		if !aborted {
			return ids, err
		}
	}
	c.watched.aborted(p.streams)
	return c.commitAtomic(ctx, a, p)
}

// beforeWatchedExec, when set (by tests), runs between the check of a watched commit and its
// transaction: where another client's change aborts it.
var beforeWatchedExec func()

// watchCommit watches the lease and the output streams of a commit on conn and reports whether
// the lease holds the commit's value and every output stream is a stream or does not exist yet,
// and what error the server answered instead.
func watchCommit(ctx context.Context, conn *goredis.Conn, a CommitArgs, p *commitPlan) (bool, error) {
	keys := make([]any, 0, 2+len(p.streams))
	keys = append(keys, "watch", a.Lease.Key)
	for _, s := range p.streams {
		keys = append(keys, s)
	}
	var lease *goredis.StringCmd
	types := make([]*goredis.StatusCmd, len(p.streams))
	_, err := conn.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
		_ = pipe.Process(ctx, goredis.NewStatusCmd(ctx, keys...))
		lease = pipe.Get(ctx, a.Lease.Key)
		for i, s := range p.streams {
			types[i] = pipe.Type(ctx, s)
		}
		return nil
	})
	if err != nil || lease.Val() != a.Lease.Value() {
		return false, err
	}
	for _, t := range types {
		if t.Val() != "stream" && t.Val() != "none" {
			return false, nil
		}
	}
	return true, nil
}

// watchedStreams are the output streams that watched commits leave to the settle script for a
// while: a stream that other writers append to makes watched commits to it fail often, and each
// failure sends the batch twice.
type watchedStreams struct {
	rdb  *goredis.Client
	mu   sync.Mutex
	wait map[string]int // stream -> commits to it that still go through the settle script
	// never: the server refused WATCH (an ACL without it), so every commit goes through the script.
	never bool
}

// watchPause is how many commits to a stream go through the settle script after a watched commit
// to it was aborted: a stream with several writers costs a watched try in this many commits.
const watchPause = 64

func newWatchedStreams(rdb *goredis.Client) *watchedStreams {
	return &watchedStreams{rdb: rdb, wait: map[string]int{}}
}

// busy reports whether a commit to streams goes through the settle script, and counts it.
func (w *watchedStreams) busy(streams []string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.never {
		return true
	}
	busy := false
	for _, s := range streams {
		if n := w.wait[s]; n > 0 {
			busy = true
			if n == 1 {
				delete(w.wait, s)
			} else {
				w.wait[s] = n - 1
			}
		}
	}
	return busy
}

// refused records that the server refuses WATCH.
func (w *watchedStreams) refused() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.never = true
}

// aborted records that a watched commit to streams was aborted.
func (w *watchedStreams) aborted(streams []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range streams {
		w.wait[s] = watchPause
	}
}
