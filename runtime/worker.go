package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// errLeaseLost ends a worker whose partition another process now owns: it stops without acking.
var errLeaseLost = errors.New("lease lost")

// poisonDeliveries is how many deliveries of one entry a node tolerates: an entry delivered more often
// kept killing the processes that took it, so it goes to the dead-letter stream instead of looping.
const poisonDeliveries = 5

// worker runs one unit (a node on one partition) while this process owns it.
type worker struct {
	r        *runner
	u        *unit
	lease    *redis.Lease // nil for units without a lease
	backoff  backoff
	recover  bool   // the consumer's own pending entries must be read again (a commit failed)
	recovery string // the last pending ID read again
}

func newWorker(r *runner, u *unit, lease *redis.Lease) *worker {
	return &worker{r: r, u: u, lease: lease}
}

// run reads, processes and commits batches until ctx ends (the process stops or gives the unit up).
// A batch that was read is always processed and committed, within the runner's drain time.
func (w *worker) run(ctx context.Context) error {
	n := w.u.node
	if !w.ensureGroup(ctx) {
		return nil
	}
	if w.lease != nil {
		// Entries another owner left pending are older than anything new: they go first.
		if err := w.reclaim(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	lastReclaim := time.Now()
	args := redis.ReadArgs{Stream: w.u.stream, Group: n.group, Consumer: w.r.opts.ProcessID,
		Count: int64(w.r.opts.BatchSize), Block: w.r.opts.Block}
	for ctx.Err() == nil {
		var batch redis.Batch
		var err error
		if w.recover {
			batch, err = w.r.rdb.ReadPending(ctx, args, w.recovery)
			if err == nil {
				if batch.Len() == 0 {
					w.recover, w.recovery = false, ""
					continue
				}
				ids := batch.IDs()
				w.recovery = maxID(ids)
			}
		} else {
			batch, err = w.r.rdb.ReadGroup(ctx, args)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, redis.ErrNoGroup) { // someone deleted the stream or the group
				w.ensureGroup(ctx)
				continue
			}
			w.r.log.Warn("reading failed; retrying", "node", n.name, "stream", w.u.stream, "err", err)
			w.backoff.wait(ctx)
			continue
		}
		w.backoff.reset()
		if batch.Len() > 0 {
			if err := w.process(ctx, batch); err != nil {
				return err
			}
		}
		if time.Since(lastReclaim) > claimIdle(n) {
			// Take over what another consumer left pending, once it has been idle long enough that
			// nobody is still working on it: a dead consumer of a partition without leases, or a
			// process that read a batch just before it noticed it had lost this partition's lease.
			if err := w.reclaim(ctx, claimIdle(n)); err != nil {
				return err
			}
			lastReclaim = time.Now()
		}
	}
	return nil
}

// claimIdle is how long an entry stays pending before a consumer of a partition without lease takes
// it over from another: longer than any attempt can take.
func claimIdle(n *node) time.Duration {
	return 2*n.timeout + 30*time.Second
}

// ensureGroup creates the node's consumer group on the unit's stream, retrying until ctx ends.
func (w *worker) ensureGroup(ctx context.Context) bool {
	start := "0"
	if w.u.startLatest {
		start = "$"
	}
	for ctx.Err() == nil {
		err := w.r.rdb.EnsureGroupAt(ctx, w.u.stream, w.u.node.group, start)
		if err == nil {
			w.backoff.reset()
			return true
		}
		w.r.log.Warn("creating consumer group failed; retrying", "node", w.u.node.name, "stream", w.u.stream, "err", err)
		w.backoff.wait(ctx)
	}
	return false
}

// reclaim takes over the entries of the group pending for at least minIdle, page by page, and
// processes them.
func (w *worker) reclaim(ctx context.Context, minIdle time.Duration) error {
	n := w.u.node
	start := "0-0"
	for ctx.Err() == nil {
		res, err := w.r.rdb.Reclaim(ctx, redis.ReclaimArgs{
			Stream: w.u.stream, Group: n.group, Consumer: w.r.opts.ProcessID, MinIdle: minIdle, Start: start,
		})
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, redis.ErrNoGroup) {
				return nil
			}
			w.r.log.Warn("reclaiming pending entries failed; retrying", "node", n.name, "stream", w.u.stream, "err", err)
			w.backoff.wait(ctx)
			continue
		}
		if res.Batch.Len() > 0 {
			w.r.log.Info("took over pending entries", "node", n.name, "stream", w.u.stream, "entries", res.Batch.Len())
			if err := w.process(ctx, res.Batch); err != nil {
				return err
			}
		}
		if res.Next == "" || res.Next == "0-0" {
			return nil
		}
		start = res.Next
	}
	return nil
}

// process handles one batch and commits its outputs with its acks. Messages that fail for good and
// entries that cannot be decoded go to the dead-letter stream; messages abandoned by a shutdown stay
// pending for another process.
func (w *worker) process(ctx context.Context, b redis.Batch) error {
	n := w.u.node
	r := w.r
	n.stats.in.Add(int64(b.Len()))

	var outs []redis.Output
	var acks []string
	for _, bad := range b.Malformed {
		outs = append(outs, r.deadLetterMalformed(n, w.u, bad))
		acks = append(acks, bad.ID)
	}
	for _, id := range b.Deleted {
		outs = append(outs, r.deadLetterDeleted(n, w.u, id))
		acks = append(acks, id)
	}
	msgs := make([]*message, len(b.Entries))
	for i, e := range b.Entries {
		msgs[i] = &message{
			id:         e.ID,
			partition:  w.u.partition,
			msg:        stages.NewMessage(e.Key, e.Payload, e.Headers),
			trace:      traceContext{parent: e.TraceParent, state: e.TraceState},
			deliveries: e.Deliveries,
		}
	}
	written := 0
	abandoned := false
	for i, res := range r.processAll(n, msgs, ctx.Done()) {
		if res.abandoned {
			abandoned = true
			continue
		}
		outs = append(outs, res.outs...)
		if !res.deadLettered {
			written += len(res.outs)
		}
		acks = append(acks, msgs[i].id)
	}
	if len(acks) == 0 && len(outs) == 0 {
		return nil
	}
	if err := n.handler.flush(); err != nil {
		// What was delivered may not be durable: acking it could lose it. Deliver the batch again.
		r.log.Error("making deliveries durable failed; the batch will be delivered again", "node", n.name, "err", err)
		w.recover = true
		w.backoff.wait(ctx)
		return nil
	}
	_, err := r.rdb.Commit(r.hard, redis.CommitArgs{
		Outputs: outs, Stream: w.u.stream, Group: n.group, IDs: acks, Lease: w.lease,
	})
	switch {
	case errors.Is(err, redis.ErrLeaseLost):
		r.log.Warn("lost the partition to another process; its entries are left to the new owner", "node", n.name, "stream", w.u.stream)
		return errLeaseLost
	case err != nil && r.hard.Err() != nil:
		return nil // the drain time is over: what was not committed stays pending for another process
	case err != nil:
		r.log.Error("committing a batch failed; it will be processed again", "node", n.name, "stream", w.u.stream, "err", err)
		w.recover = true
		w.backoff.wait(ctx)
		return nil
	}
	n.stats.out.Add(int64(written))
	if abandoned {
		w.recover = true
	}
	return nil
}

// result is what processing one message came to.
type result struct {
	outs         []redis.Output
	deadLettered bool // outs is the message's dead letter
	abandoned    bool // shutdown interrupted it: not acked, not dead-lettered
}

// processMessage runs a message through the node's handler, retrying by the node's policy, and
// dead-letters it when it fails for good.
func (r *runner) processMessage(n *node, m *message, stopping <-chan struct{}) result {
	if m.deliveries > poisonDeliveries {
		err := stages.Permanent(errors.New("delivered " + itoa(m.deliveries) +
			" times without being acknowledged: every process that took it died or lost it (a poison message)"))
		return r.deadLettered(n, m, err, 0, time.Now())
	}
	// A retry starts again from the payload as it arrived, whatever the failed attempt changed.
	payload, _ := m.msg.Payload()
	key, headers := m.msg.Key, m.msg.Headers
	var firstFailure time.Time
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			m.msg = stages.NewMessage(key, payload, headers)
		}
		ctx, cancel := context.WithTimeout(r.hard, n.timeout)
		outs, err := n.handler.handle(ctx, m, nil)
		timedOut := ctx.Err() == context.DeadlineExceeded
		cancel()
		if err == nil {
			return result{outs: outs}
		}
		if r.hard.Err() != nil {
			return result{abandoned: true} // the failure may be the shutdown's doing
		}
		if timedOut {
			err = errors.Join(err, errors.New("the attempt took longer than the timeout of "+flow.FormatDuration(n.timeout)))
		}
		n.stats.failed.Add(1)
		if firstFailure.IsZero() {
			firstFailure = time.Now()
		}
		if stages.IsPermanent(err) || attempt >= n.retry.MaxAttempts {
			return r.deadLettered(n, m, err, attempt, firstFailure)
		}
		delay := jittered(n.retry.Delay(attempt), n.retry.Jitter)
		r.log.Debug("attempt failed; retrying", "node", n.name, "id", m.id, "attempt", attempt, "delay", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-stopping:
			t.Stop()
			return result{abandoned: true} // redelivered after the restart, retry count and all
		}
		n.stats.retried.Add(1)
	}
}

func (r *runner) deadLettered(n *node, m *message, err error, attempts int, first time.Time) result {
	out := r.deadLetterMessage(n, m, err, attempts, first)
	return result{outs: []redis.Output{out}, deadLettered: true}
}

// maxID returns the greatest of stream IDs.
func maxID(ids []string) string {
	best := ""
	for _, id := range ids {
		if best == "" {
			best = id
			continue
		}
		if c, err := redis.CompareIDs(id, best); err == nil && c > 0 {
			best = id
		}
	}
	return best
}
