package redis

import (
	"context"
	"errors"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// A group read blocks in Redis for up to its Block duration, and go-redis does not end a command
// when its context is canceled: a process that stops would wait for every idle reader's block to
// run out. The client remembers the ID of each connection it opens (CLIENT ID, once per
// connection), so that UnblockReads can end those blocks at once with CLIENT UNBLOCK, whose
// default (TIMEOUT) makes the blocked command return what it returns when its time is up: nothing
// read, nothing delivered.

// ErrCannotUnblock is UnblockReads on a client that cannot end blocked reads: a cluster client, a
// server without CLIENT ID, a user without permission for CLIENT UNBLOCK.
var ErrCannotUnblock = errors.New("redis: cannot unblock reads")

// connIDs are the IDs of the connections a client opened, the most recent last. IDs only grow and
// the oldest connections are the likeliest to be closed, so a full list forgets the oldest.
type connIDs struct {
	mu      sync.Mutex
	ids     []int64
	max     int
	refused bool // CLIENT ID or CLIENT UNBLOCK failed: do not try again
}

func newConnIDs(poolSize int) *connIDs { return &connIDs{max: 2 * max(poolSize, 1)} }

// onConnect is the go-redis OnConnect hook: it records the new connection's ID, then runs next
// (the hook that was there, if any). A failed CLIENT ID leaves the connection usable.
func (r *connIDs) onConnect(next func(context.Context, *goredis.Conn) error) func(context.Context, *goredis.Conn) error {
	return func(ctx context.Context, cn *goredis.Conn) error {
		r.mu.Lock()
		refused := r.refused
		r.mu.Unlock()
		if !refused {
			id, err := cn.ClientID(ctx).Result()
			r.mu.Lock()
			if err != nil {
				r.refused = Unrecoverable(err) // NOPERM, unknown command; a network error fails the connection anyway
			} else {
				if len(r.ids) >= r.max {
					r.ids = append(r.ids[:0], r.ids[1:]...)
				}
				r.ids = append(r.ids, id)
			}
			r.mu.Unlock()
		}
		if next != nil {
			return next(ctx, cn)
		}
		return nil
	}
}

// UnblockReads ends, as if their time were up, the blocked commands (XREADGROUP ... BLOCK) of
// every connection of this client, in one pipeline. Whoever waits for one of them gets its empty
// reply at once. It returns ErrCannotUnblock when this client cannot do that: blocked reads then
// wait out their Block.
func (c *Client) UnblockReads(ctx context.Context) error {
	r := c.conns
	if r == nil {
		return ErrCannotUnblock
	}
	r.mu.Lock()
	ids := append([]int64(nil), r.ids...)
	refused := r.refused
	r.mu.Unlock()
	if refused {
		return ErrCannotUnblock
	}
	if len(ids) == 0 {
		return nil
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*goredis.IntCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.ClientUnblock(ctx, id)
	}
	_, _ = pipe.Exec(ctx)
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			if Unrecoverable(err) {
				r.mu.Lock()
				r.refused = true // NOPERM, or a server without CLIENT UNBLOCK
				r.mu.Unlock()
				return ErrCannotUnblock
			}
			return wrap(err, "unblocking reads", "")
		}
	}
	return nil
}
