package runtime

import (
	"context"
	"errors"
	"fmt"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// A worker's commit: a prepared batch's outputs, acks, retry moves, state and watermarks in one
// fenced step (docs/design/commit.md), after the capped partitions it writes have room.

// commit writes a prepared batch's outputs with its acks and retry moves in one step.
func (w *worker) commit(ctx context.Context, c *batchCommit) error {
	n := w.u.node
	r := w.r
	if err := w.admit(ctx, c.admits); err != nil {
		r.fail(fmt.Errorf("%s %s: %w", n.typ, n.name, err))
		return errStopped
	}
	_, err := r.rdb.Commit(r.hard, c.args)
	for _, g := range c.admits {
		if err == nil {
			g.written(1)
		} else {
			g.dropped(1)
		}
	}
	switch {
	case errors.Is(err, redis.ErrLeaseLost):
		r.log.Warn("lost the partition to another process; its entries are left to the new owner", "node", n.name, "stream", w.u.stream)
		if w.time != nil {
			w.time.Republish()
		}
		return errLeaseLost
	case err != nil && r.hard.Err() != nil:
		return nil // the drain time is over: what was not committed stays pending for another process
	case err != nil:
		if !r.redisFailed(n.typ+" "+n.name+" committing a batch of "+w.u.stream, err) {
			return errStopped
		}
		r.log.Debug("committing a batch failed; it will be processed again", "node", n.name, "stream", w.u.stream, "err", err)
		w.uncertain.add(c) // it may have been applied: the recovery tells
		w.recover, w.recovery = true, ""
		w.backoff.wait(ctx, w.r.clock, &w.r.jitter)
		return nil
	}
	r.outage.ok()
	if !c.abandoned {
		w.timeCommitted()
	}
	w.counted(c)
	if c.abandoned {
		w.recover, w.recovery = true, ""
	}
	return nil
}

// admit waits until every capped partition that a batch writes to has room for its outputs. A
// stop ends the wait: the batch is processed, and committing it beats doing it again.
// Its error is one that waiting does not heal.
func (w *worker) admit(ctx context.Context, gates []*partitionGate) error {
	if len(gates) == 0 {
		return nil
	}
	defer w.r.activity.waiting()() // waiting for room is not work: a virtual clock may move on meanwhile
	counts := make(map[*partitionGate]int64, len(gates))
	for _, g := range gates {
		counts[g]++
	}
	admitted := make(map[*partitionGate]int64, len(counts))
	for g, n := range counts {
		err := w.r.backpressure.admit(ctx, g, n, w.u.node)
		switch {
		case err != nil && ctx.Err() != nil:
			g.letThrough(n) // a stop: committing the batch beats doing it again
		case err != nil:
			for g, n := range admitted {
				g.dropped(n)
			}
			return err
		}
		admitted[g] = n
	}
	return nil
}
