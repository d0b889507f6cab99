package redis

import (
	"context"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// A unit's commit on a single server (outputs, acks and a stateful stage's state, fenced by the
// lease) is fenced with WATCH instead of the settle script when it can be: the script received
// every input's ID, and every state key, value and timer, as an argument, and each argument that
// passes through Lua (made a Lua string, then a Redis string again for XACK or HSET) cost Redis
// more than the command that used it: about 0.4 us per message at every hop for an ID, and as much
// again for the state a message changes.
//
// commitWatched first watches the lease, the output streams and the state's keys and reads them
// (one round trip), then, if the lease holds the commit's value and no key holds another type than
// the commit writes, sends the transaction: the XADDs, the state's writes as the script makes them
// (HSET, HDEL, ZADD and ZREM, in its order) and a plain XACK. EXEC runs nothing if any watched key
// changed since (the lease renewed, lost or expired, which aborts EXEC since Redis 6.0.9; an
// output stream written by another writer, deleted or replaced; a state key replaced): what it
// runs is what the script would have checked. Whenever anything is not as expected, the commit
// goes through the settle script (commitAtomic) instead, which decides and reports as before.

// watchable reports whether commitWatched can make a commit: a single server, a lease, acks,
// perhaps state, and nothing else to settle (no retries, no checkpoint), plain outputs only (no
// markers, no payloads under their own keys, whose scripts can fail inside EXEC), and no output
// stream whose watched commits were aborted lately (see watchedStreams).
func (c *Client) watchable(a CommitArgs, p *commitPlan) bool {
	if c.watched == nil || a.Lease == nil || len(a.IDs) == 0 || a.Checkpoint != nil ||
		len(a.RetryDone)+len(a.Retries) > 0 || len(p.order)+len(p.guards) > 0 {
		return false
	}
	if s := a.State; !s.empty() && (s.TimersKey == "" && len(s.Timers)+len(s.Cancel) > 0 ||
		s.HoldsKey == "" && len(s.Holds)+len(s.Release) > 0) {
		return false // the script reports timers or holds without a key
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
			return queueWatchedSettle(ctx, pipe, a)
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

// watchCommit watches the lease, the output streams and the state's keys of a commit on conn and
// reports whether the lease holds the commit's value and every other key holds what the commit
// writes to it or does not exist yet, and what error the server answered instead.
func watchCommit(ctx context.Context, conn *goredis.Conn, a CommitArgs, p *commitPlan) (bool, error) {
	watched := watchedTypes(a, p)
	keys := make([]any, 0, 2+len(watched))
	keys = append(keys, "watch", a.Lease.Key)
	for _, w := range watched {
		keys = append(keys, w.key)
	}
	var lease *goredis.StringCmd
	types := make([]*goredis.StatusCmd, len(watched))
	_, err := conn.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
		_ = pipe.Process(ctx, goredis.NewStatusCmd(ctx, keys...))
		lease = pipe.Get(ctx, a.Lease.Key)
		for i, w := range watched {
			types[i] = pipe.Type(ctx, w.key)
		}
		return nil
	})
	if err != nil || lease.Val() != a.Lease.Value() {
		return false, err
	}
	for i, t := range types {
		if t.Val() != watched[i].typ && t.Val() != "none" {
			return false, nil
		}
	}
	return true, nil
}

// keyType is a key that a watched commit writes, and the type of key it writes it as.
type keyType struct{ key, typ string }

// watchedTypes are the keys a watched commit writes besides the lease: its output streams and the
// state's hash, timer set and holds set that it changes.
func watchedTypes(a CommitArgs, p *commitPlan) []keyType {
	keys := make([]keyType, 0, len(p.streams)+3)
	for _, s := range p.streams {
		keys = append(keys, keyType{s, "stream"})
	}
	s := a.State
	if s.empty() {
		return keys
	}
	if len(s.Set)+len(s.Delete) > 0 {
		keys = append(keys, keyType{s.Key, "hash"})
	}
	if len(s.Timers)+len(s.Cancel) > 0 {
		keys = append(keys, keyType{s.TimersKey, "zset"})
	}
	if len(s.Holds)+len(s.Release) > 0 {
		keys = append(keys, keyType{s.HoldsKey, "zset"})
	}
	return keys
}

// queueWatchedSettle adds the settle of a watched commit to its transaction: the state's writes,
// as the settle script makes them and in its order, then the plain XACK. The command it returns
// reports the first error of them all.
func queueWatchedSettle(ctx context.Context, pipe goredis.Pipeliner, a CommitArgs) goredis.Cmder {
	s := a.State
	if s.empty() {
		return queueXAck(ctx, pipe, a)
	}
	var writes []goredis.Cmder
	queue := func(args []any) {
		cmd := goredis.NewCmd(ctx, args...)
		_ = pipe.Process(ctx, cmd)
		writes = append(writes, cmd)
	}
	// remove queues cmd (HDEL, ZREM) of names on key; zadd the members of a sorted set, earliest
	// first, as the script has the timers (the order of members changes nothing else).
	remove := func(cmd, key string, names []string) {
		if len(names) > 0 {
			queue(appendIDs(append(make([]any, 0, 2+len(names)), cmd, key), names))
		}
	}
	zadd := func(key string, members map[string]int64) {
		if len(members) == 0 {
			return
		}
		args := append(make([]any, 0, 2+2*len(members)), "zadd", key)
		for _, t := range byTime(members) {
			args = append(args, t.At, t.Name)
		}
		queue(args)
	}
	if len(s.Set) > 0 {
		args := append(make([]any, 0, 2+2*len(s.Set)), "hset", s.Key)
		for k, v := range s.Set {
			args = append(args, k, v)
		}
		queue(args)
	}
	remove("hdel", s.Key, s.Delete)
	zadd(s.TimersKey, s.Timers)
	remove("zrem", s.TimersKey, s.Cancel)
	zadd(s.HoldsKey, s.Holds)
	remove("zrem", s.HoldsKey, s.Release)
	return stateSettle{IntCmd: queueXAck(ctx, pipe, a), writes: writes}
}

// stateSettle is the XACK of a watched commit with state, whose error is the first of the state's
// writes and the XACK: a write that failed inside EXEC is reported, as the script would report it.
type stateSettle struct {
	*goredis.IntCmd
	writes []goredis.Cmder
}

func (s stateSettle) Err() error {
	for _, w := range s.writes {
		if err := w.Err(); err != nil {
			return err
		}
	}
	return s.IntCmd.Err()
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
