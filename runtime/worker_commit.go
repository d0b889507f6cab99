package runtime

import (
	"context"
	"errors"
	"fmt"

	"github.com/flowrun/flowrun/runtime/backpressure"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A worker's commit: a prepared batch's outputs, acks, retry moves, state and watermarks in one
// fenced step (docs/design/commit.md), after the capped partitions it writes have room.

// commit writes a prepared batch's outputs with its acks and retry moves in one step.
func (w *worker) commit(ctx context.Context, c *batchCommit) error {
	if err := w.admit(ctx, c.admits); err != nil {
		return err
	}
	_, err := w.r.rdb.Commit(w.r.hard, c.args)
	return w.committed(ctx, c, err)
}

// committed records what came of a batch's commit, which ended with err: the outputs it let through
// the gates of capped partitions, the counts and watermarks of a commit that ended well, and the
// recovery of one that did not (or a lost lease).
func (w *worker) committed(ctx context.Context, c *batchCommit, err error) error {
	n := w.u.node
	r := w.r
	if err != nil {
		w.redisWentAway() // and the batch's keys may be in the state, or not
	}
	if err != nil && c.timeBefore != nil {
		w.time.Undo(c.timeBefore) // the batch processed meanwhile is given up (commitOverlapped)
	}
	for _, g := range c.admits {
		if err == nil {
			g.Written(1)
		} else {
			g.Dropped(1)
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
	r.outage.OK()
	switch {
	case c.timeBefore != nil:
		w.timeClosed(c.timeBefore.Closed()) // made the next batch's start already
	case !c.abandoned:
		w.timeCommitted()
	}
	if !c.counted {
		w.counted(c)
	}
	if c.args.State != nil {
		w.held.Committed(c.args.State.Set, c.args.State.Delete)
		c.state.Committed()
	}
	w.committedState = c.state // written: the next batch may reuse its memory
	w.keepCommitMemory(c)
	if c.abandoned {
		w.recover, w.recovery = true, ""
	}
	return nil
}

// admit waits until every capped partition that a batch writes to has room for its outputs. A
// stop ends the wait: the batch is processed, and committing it beats doing it again.
// A failure that waiting does not heal fails the run, and admit returns errStopped.
func (w *worker) admit(ctx context.Context, gates []*backpressure.Gate) error {
	if len(gates) == 0 {
		return nil
	}
	// Waiting for room is not work: a virtual clock may move on meanwhile.
	done := w.r.activity.waiting()
	defer done()
	counts := make(map[*backpressure.Gate]int64, len(gates))
	for _, g := range gates {
		counts[g]++
	}
	admitted := make(map[*backpressure.Gate]int64, len(counts))
	for g, n := range counts {
		err := w.r.backpressure.Admit(ctx, g, n, w.u.node)
		switch {
		case err != nil && ctx.Err() != nil:
			g.LetThrough(n) // a stop: committing the batch beats doing it again
		case err != nil:
			for g, n := range admitted {
				g.Dropped(n)
			}
			w.r.fail(fmt.Errorf("%s %s: %w", w.u.node.typ, w.u.node.name, err))
			return errStopped
		}
		admitted[g] = n
	}
	return nil
}

// counted adds a committed batch's counts to its nodes': the unit's node, or the stages of its
// chain, with what a stateful stage found late or repeated.
func (w *worker) counted(c *batchCommit) {
	n := w.u.node
	late, duplicates := c.state.Outcomes()
	c.counts.nodes[0].late += late
	c.counts.nodes[0].duplicates += duplicates
	if n.chain == nil {
		n.stats.count(&c.counts.nodes[0])
		return
	}
	for i, cn := range n.chain.nodes {
		cn.stats.count(&c.counts.nodes[i])
	}
}

// uncertainCommits are the batches whose commit failed without saying whether it was applied (its
// reply was lost), until the worker has read its pending entries again (worker.recover): a batch
// none of whose entries came back was committed, and counts.
type uncertainCommits struct {
	batches []*batchCommit
	ids     map[string]int // the entries each batch acknowledged -> its index in batches
}

// add holds back the counts of a batch whose commit may or may not have been applied.
func (u *uncertainCommits) add(c *batchCommit) {
	if u.ids == nil {
		u.ids = map[string]int{}
	}
	for _, id := range c.args.IDs {
		u.ids[id] = len(u.batches)
	}
	u.batches = append(u.batches, c)
}

// readAgain drops the batches of which b, pending entries read again, holds one: their commit was
// not applied (it is atomic), and they are being processed again.
func (u *uncertainCommits) readAgain(b redis.Batch) {
	if len(u.ids) == 0 {
		return
	}
	for _, id := range b.IDs() {
		if i, ok := u.ids[id]; ok {
			u.batches[i] = nil
		}
	}
}

// settle counts the batches whose entries did not come back once the pending entries have all been
// read again: their commit was applied. A batch that acknowledged nothing (only retries moved)
// cannot be told apart that way: it counts.
func (u *uncertainCommits) settle(w *worker) {
	for _, c := range u.batches {
		if c != nil {
			w.counted(c)
		}
	}
	u.batches, u.ids = nil, nil
}
