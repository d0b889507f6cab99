package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

var (
	// errLeaseLost ends a worker whose partition another process now owns: it stops without acking.
	errLeaseLost = errors.New("lease lost")
	// errStopped ends a worker after a failure that ended the run (runner.fail has it).
	errStopped = errors.New("the run stopped")
)

// worker runs one unit (a node on one partition) while this process owns it.
type worker struct {
	r        *runner
	u        *unit
	lease    *redis.Lease // nil for units without a lease
	backoff  backoff
	recover  bool   // the consumer's own pending entries must be read again (a commit failed)
	recovery string // the last pending ID read again
	// nextRetries is when the unit's retry set is next looked at.
	nextRetries time.Time
	// time is the unit's watermarks (worker_time.go); nil for a unit that no stateful stage
	// depends on.
	time *state.Watermarks
	// stamps: the unit puts its messages' entry times in their headers (stampEntryTime).
	stamps bool
	// stateKeys are a stateful stage's keys on the unit's partition.
	stateKeys state.Keys
	// uncertain holds the counts of commits whose reply was lost until the recovery tells whether
	// they were applied (outcomes.go).
	uncertain uncertainCommits
	// timersDue: the last batch left timers due that it had no room to fire; the next turn, with
	// or without messages, fires them (fireTimers).
	timersDue bool
}

func newWorker(r *runner, u *unit, lease *redis.Lease) *worker {
	w := &worker{r: r, u: u, lease: lease}
	if spec := r.timeSpec(u); spec != nil {
		w.time, w.stamps = state.NewWatermarks(*spec), stampsEntryTime(spec)
	}
	if n := u.node; n.stateful {
		w.stateKeys = state.Keys{Hash: r.keys.State(n.input.Name, u.partition, n.name),
			Timers: r.keys.Timers(n.input.Name, u.partition, n.name), Holds: r.keys.Holds(n.input.Name, u.partition, n.name)}
	}
	return w
}

// run reads, processes and commits batches until ctx ends (the process stops or gives the unit up).
// A batch that was read is always processed and committed, within the runner's drain time.
func (w *worker) run(ctx context.Context) error {
	started := sync.OnceFunc(func() { w.r.activity.add(-1) }) // see ownership.startWorkerLocked
	defer started()
	n := w.u.node
	if !w.ensureGroup(ctx) {
		return nil
	}
	started() // it has sent a command: what follows counts as work on its own (process, reads)
	if w.lease != nil {
		// Entries another owner left pending are older than anything new: they go first.
		if err := w.reclaim(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	lastReclaim := w.r.clock.Now()
	args := redis.ReadArgs{Stream: w.u.stream, Group: n.group, Consumer: w.r.opts.ProcessID,
		Count: n.readCount, Block: w.r.opts.Block}
	var ahead *readResult // the next batch, read while the last one was committed
	for ctx.Err() == nil {
		if w.u.retryKey != "" && !w.r.clock.Now().Before(w.nextRetries) {
			handled, err := w.retryDue(ctx)
			if err != nil {
				return err
			}
			if handled {
				continue // there may be more due
			}
		}
		batch, recovered, err := w.read(ctx, args, &ahead)
		if recovered {
			continue
		}
		if err != nil {
			if !w.readFailed(ctx, err) {
				return nil
			}
			continue
		}
		w.r.outage.ok()
		w.backoff.reset()
		if batch.Len() > 0 {
			if ahead, err = w.processReadingAhead(ctx, batch, args); err != nil {
				return err
			}
		} else if err := w.idleTurn(ctx); err != nil {
			return err
		}
		if err := w.reclaimIdle(ctx, &lastReclaim); err != nil {
			return err
		}
	}
	if ahead != nil && ahead.err == nil && ahead.batch.Len() > 0 {
		// Read just before the stop: a batch that was read is processed.
		return w.process(ctx, ahead.batch, nil, nil)
	}
	return nil
}

// read returns the unit's next batch: the one read ahead, the consumer's own pending entries
// while it recovers, or new entries. recovered: the recovery read everything again, and the
// turn is over.
func (w *worker) read(ctx context.Context, args redis.ReadArgs, ahead **readResult) (batch redis.Batch, recovered bool, err error) {
	switch {
	case *ahead != nil:
		batch, err = (*ahead).batch, (*ahead).err
		*ahead = nil
	case w.recover:
		batch, err = w.r.rdb.ReadPending(ctx, args, w.recovery)
		if err == nil {
			if batch.Len() == 0 {
				w.recover, w.recovery = false, ""
				w.uncertain.settle(w)
				return batch, true, nil
			}
			ids := batch.IDs()
			w.recovery = maxID(ids)
		}
	default:
		batch, err = w.r.rdb.ReadGroup(ctx, w.readArgs(args))
	}
	return batch, false, err
}

// readFailed handles a read that failed, and reports whether the worker goes on.
func (w *worker) readFailed(ctx context.Context, err error) bool {
	n := w.u.node
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, redis.ErrNoGroup) { // someone deleted the stream or the group
		w.ensureGroup(ctx)
		return true
	}
	if !w.r.redisFailed(n.typ+" "+n.name+" reading "+w.u.stream, err) {
		return false
	}
	// The read may have delivered entries whose reply was lost with the connection: they
	// are in this consumer's pending list, so read that again before anything new.
	w.recover, w.recovery = true, ""
	w.backoff.wait(ctx, w.r)
	return true
}

// reclaimIdle takes over what another consumer left pending, once it has been idle long enough
// that nobody is still working on it: a dead consumer of a partition without leases, or a process
// that read a batch just before it noticed it had lost this partition's lease.
func (w *worker) reclaimIdle(ctx context.Context, lastReclaim *time.Time) error {
	n := w.u.node
	if w.r.clock.Now().Sub(*lastReclaim) > n.claimIdle {
		if err := w.reclaim(ctx, n.claimIdle); err != nil {
			return err
		}
		*lastReclaim = w.r.clock.Now()
	}
	return nil
}

// readArgs returns the arguments of the next read: args, waiting for new entries no longer than
// until the next retry is due.
func (w *worker) readArgs(args redis.ReadArgs) redis.ReadArgs {
	if w.timersDue {
		args.Block = time.Millisecond // the next turn has timers to fire, with or without entries
	}
	if w.u.retryKey != "" {
		if until := w.nextRetries.Sub(w.r.clock.Now()); until < args.Block {
			args.Block = max(until, time.Millisecond)
		}
	}
	return args
}

// readResult is a read's batch or error.
type readResult struct {
	batch redis.Batch
	err   error
}

// processReadingAhead processes a batch read from the stream, and commits it while it reads the
// next one: Redis works on both at once, and the next batch is there when the commit is done (the
// sequence read, process, commit, read leaves Redis and the process waiting for each other in
// turn). It returns the batch read ahead, or nil when the commit did not end well: the entries that
// read delivered are then pending for this consumer, and the recovery the failed commit started
// (or, when the partition is lost, its new owner) reads them again.
func (w *worker) processReadingAhead(ctx context.Context, b redis.Batch, args redis.ReadArgs) (*readResult, error) {
	w.r.activity.add(1)
	defer w.r.activity.add(-1)
	if w.time != nil {
		w.time.Begin()
	}
	c := w.prepare(ctx, b, nil, nil)
	if c == nil {
		return nil, nil
	}
	if w.recover || ctx.Err() != nil {
		return nil, w.commit(ctx, c)
	}
	read := w.readArgs(args)
	ahead := make(chan readResult, 1)
	go func() {
		b, err := w.r.rdb.ReadGroup(ctx, read)
		ahead <- readResult{b, err}
	}()
	err := w.commit(ctx, c)
	done := w.r.activity.waiting() // the read ahead may wait on the clock for entries
	next := <-ahead
	done()
	if err != nil || w.recover {
		return nil, err
	}
	return &next, nil
}

// claimIdle is how long an entry stays pending before a consumer of a partition without lease takes
// it over from another, and how long a consumer holds the due retries it took: longer than any
// attempt can take. It sets node.claimIdle, which tests shorten (export_safety_test.go).
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
			w.r.outage.ok()
			w.backoff.reset()
			return true
		}
		if ctx.Err() != nil || !w.r.redisFailed(w.u.node.typ+" "+w.u.node.name+" creating its consumer group on "+w.u.stream, err) {
			return false
		}
		w.backoff.wait(ctx, w.r)
	}
	return false
}

// reclaim takes over the entries of the group pending for at least minIdle, page by page, and
// processes them.
func (w *worker) reclaim(ctx context.Context, minIdle time.Duration) error {
	n := w.u.node
	start := "0-0"
	for ctx.Err() == nil {
		// The entries it takes are work from the reply on: those deleted while pending leave the
		// pending list with it, and only this batch holds them until their dead letters commit.
		w.r.activity.add(1)
		res, err := w.r.rdb.Reclaim(ctx, redis.ReclaimArgs{
			Stream: w.u.stream, Group: n.group, Consumer: w.r.opts.ProcessID, MinIdle: minIdle, Start: start,
		})
		if err != nil {
			w.r.activity.add(-1)
			if ctx.Err() != nil || errors.Is(err, redis.ErrNoGroup) {
				return nil
			}
			if !w.r.redisFailed(n.typ+" "+n.name+" taking over pending entries of "+w.u.stream, err) {
				return nil
			}
			w.recover, w.recovery = true, "" // a lost reply may have claimed entries for this consumer
			w.backoff.wait(ctx, w.r)
			continue
		}
		if res.Batch.Len() > 0 {
			w.r.log.Info("took over pending entries", "node", n.name, "stream", w.u.stream, "entries", res.Batch.Len())
			if err := w.process(ctx, res.Batch, nil, nil); err != nil {
				w.r.activity.add(-1)
				return err
			}
		}
		w.r.activity.add(-1)
		if res.Next == "" || res.Next == "0-0" {
			return nil
		}
		start = res.Next
	}
	return nil
}

// retryDue processes the retries of the unit that are due, and reports whether there were any.
func (w *worker) retryDue(ctx context.Context) (bool, error) {
	due, bad, err := w.r.rdb.ClaimRetries(ctx, w.u.retryKey, w.r.clock.Now(), int64(w.r.opts.BatchSize), w.u.node.claimIdle)
	if err != nil {
		if ctx.Err() == nil && !w.r.redisFailed(w.u.node.typ+" "+w.u.node.name+" reading its due retries "+w.u.retryKey, err) {
			return false, errStopped
		}
		w.nextRetries = w.r.clock.Now().Add(w.r.opts.RetryPoll)
		return false, nil
	}
	if len(due)+len(bad) == 0 {
		w.nextRetries = w.r.clock.Now().Add(w.r.opts.RetryPoll)
		return false, nil
	}
	return true, w.process(ctx, redis.Batch{}, due, bad)
}

// entryMessage is the message of an entry (read: as read from a stream, whose reading checked its
// payload); a timed unit's has its entry's time, the event time of a message that carries none.
func (w *worker) entryMessage(e redis.Entry, read bool) stages.Message {
	var msg stages.Message
	if read { // checked as it was read (redis.DecodeEntry); a retry's was not
		msg = stages.NewEntryMessage(e.Key, e.Payload, e.Headers)
	} else {
		msg = stages.NewMessage(e.Key, e.Payload, e.Headers)
	}
	if w.time == nil {
		return msg
	}
	if ms, err := redis.IDMillis(e.ID); err == nil {
		msg.EntryTime = time.UnixMilli(ms)
	}
	if w.stamps {
		stampEntryTime(&msg, e.ID)
	}
	return msg
}

// process handles one batch, read from the stream or due in the retry set, and commits its outputs
// with its acks and retry moves in one step. Messages that fail for good and entries that cannot be
// decoded go to the dead-letter stream; messages that wait for a later retry go to the retry set;
// messages abandoned by a shutdown stay where they were for another process.
func (w *worker) process(ctx context.Context, b redis.Batch, due, badRetries []redis.Retry) error {
	if w.time != nil {
		w.time.Begin()
	}
	return w.processBegun(ctx, b, due, badRetries)
}

// processBegun is process once the batch's watermarks have begun (an idle turn moved them).
func (w *worker) processBegun(ctx context.Context, b redis.Batch, due, badRetries []redis.Retry) error {
	w.r.activity.add(1)
	defer w.r.activity.add(-1)
	c := w.prepare(ctx, b, due, badRetries)
	if c == nil {
		return nil
	}
	return w.commit(ctx, c)
}

// batchCommit is a processed batch, ready to commit.
type batchCommit struct {
	args      redis.CommitArgs
	abandoned bool // a shutdown interrupted some messages: they stay pending
	// admits has an element per output to a partition whose backlog is capped (max_lag): the
	// commit waits until each has room.
	admits []*partitionGate
	state  *state.Batch // a stateful stage's, whose outcomes count once the batch is committed
	// counts are what the batch did, counted once it is committed (outcomes.go).
	counts *batchCounts
}

// prepare processes a batch (see process) and returns what to commit, or nil when there is
// nothing to commit or the batch must be delivered again. Its steps: the entries that cannot be
// processed go to the dead letters; the messages are made, with their watermarks (worker_time.go)
// and state; they are processed; the due timers fire; the watermarks go with the commit.
func (w *worker) prepare(ctx context.Context, b redis.Batch, due, badRetries []redis.Retry) *batchCommit {
	w.uncertain.readAgain(b)
	c := &batchCommit{counts: newBatchCounts(w.u.node)}
	total := b.Len() + len(due) + len(badRetries)
	// One allocation each for the batch's outputs (most stages write one per input), acks and
	// messages: the steady state allocates per batch, not per message.
	c.args = redis.CommitArgs{Outputs: make([]redis.Output, 0, total), IDs: make([]string, 0, total)}
	var retryDone []redis.Retry
	w.deadLetterUnreadable(c, b, badRetries, &retryDone)
	msgs := w.messagesOf(b, due)
	if err := w.beginState(c, msgs, b.Len() > 0); err != nil {
		return w.again(ctx, "reading the watermark failed; the batch will be processed again", err)
	}
	retries := w.processMessages(ctx, c, msgs, &retryDone)
	if !c.abandoned {
		if why, err := w.endState(c, b); err != nil {
			return w.again(ctx, why, err)
		}
	}
	return w.finishBatch(ctx, c, retryDone, retries)
}

// beginState starts what a batch does to watermarks and state: each message's watermark, and a
// stateful stage's batch state, with the keys its messages will read fetched at once. A batch
// that was read is processed and committed whether or not the worker stops meanwhile: its reads
// too, within the drain time (the runner's hard context).
func (w *worker) beginState(c *batchCommit, msgs []*message, read bool) error {
	n, hard := w.u.node, w.r.hard
	watermarks, err := w.beginTime(hard, msgs, read)
	if err != nil || !n.stateful {
		return err
	}
	c.state = state.NewBatch(w.r.rdb, w.stateKeys, w.u.partition)
	for i, m := range msgs {
		m.state, m.watermark = c.state, watermarks[i]
	}
	if n.prefetch != nil && len(msgs) > 0 {
		var keys []string
		for _, m := range msgs {
			keys = n.prefetch.StateKeys(&m.msg, keys)
		}
		c.state.Prefetch(hard, keys)
	}
	return nil
}

// endState ends it, once the batch's messages are processed: the writers' minimum read before the
// batch counts, the timers due fire (those left over fire next turn), and the marks to pass on go
// with the commit. An error says why the batch must be processed again.
func (w *worker) endState(c *batchCommit, b redis.Batch) (string, error) {
	n, hard := w.u.node, w.r.hard
	if w.time != nil && b.Len() > 0 {
		w.time.Reached(maxID(b.IDs()))
	}
	var timersLeft int64
	if n.timers != nil {
		fired, left, err := w.fireTimers(hard, n.timers, c.state, w.timerWatermark())
		if err != nil {
			// The batch's state may be half way through its timers.
			return "firing the due timers failed; the batch will be processed again", err
		}
		c.args.Outputs = append(c.args.Outputs, fired...)
		c.counts.nodes[0].written += int64(len(fired)) // a timer's results are entries written, no message's outcome
		timersLeft = left
	}
	w.timersDue = timersLeft > 0
	marks, err := w.endTime(hard, c.state, timersLeft)
	if err != nil {
		return "reading the holds of the watermark failed; the batch will be processed again", err
	}
	c.args.Marks = marks
	return "", nil
}

// finishBatch makes a processed batch a commit: nil when it has nothing to make durable, or when
// its deliveries cannot be made durable (it is delivered again).
func (w *worker) finishBatch(ctx context.Context, c *batchCommit, retryDone, retries []redis.Retry) *batchCommit {
	n := w.u.node
	c.args.State = c.state.Writes()
	if len(c.args.IDs) == 0 && len(c.args.Outputs) == 0 && len(retryDone) == 0 && len(retries) == 0 && c.args.State == nil &&
		len(c.args.Marks) == 0 {
		w.timeCommitted() // nothing to make durable: what the watermarks did holds
		return nil
	}
	if err := n.handler.flush(w.r.hard); err != nil {
		// What was delivered may not be durable: acking it could lose it. Deliver the batch again.
		w.r.log.Error("making deliveries durable failed; the batch will be delivered again", "node", n.name, "err", err)
		w.recover, w.recovery = true, ""
		w.backoff.wait(ctx, w.r)
		return nil
	}
	c.args.Stream, c.args.Group, c.args.Lease, c.args.DedupTTL = w.u.stream, n.group, w.lease, w.r.dedupTTL
	if len(retryDone)+len(retries) > 0 {
		c.args.RetryKey, c.args.RetryDone, c.args.Retries = w.u.retryKey, retryDone, retries
	}
	return c
}

// again gives a batch up, to be processed again once the recovery reads its entries again.
func (w *worker) again(ctx context.Context, why string, err error) *batchCommit {
	if ctx.Err() == nil {
		w.r.log.Warn(why, "node", w.u.node.name, "err", err)
	}
	w.recover, w.recovery = true, ""
	w.backoff.wait(ctx, w.r)
	return nil
}

// deadLetterUnreadable dead-letters what a batch holds that cannot be processed: malformed
// entries, entries deleted while pending, retries that cannot be decoded.
func (w *worker) deadLetterUnreadable(c *batchCommit, b redis.Batch, badRetries []redis.Retry, retryDone *[]redis.Retry) {
	n, r := w.u.node, w.r
	for _, bad := range b.Malformed {
		c.args.Outputs = append(c.args.Outputs, r.deadLetterMalformed(n, w.u, bad))
		c.args.IDs = append(c.args.IDs, bad.ID)
	}
	for _, id := range b.Deleted {
		c.args.Outputs = append(c.args.Outputs, r.deadLetterDeleted(n, w.u, id))
		c.args.IDs = append(c.args.IDs, id)
	}
	own := &c.counts.nodes[0] // n's, or its chain's first stage's
	own.in += int64(len(b.Malformed) + len(b.Deleted))
	// A bad retry was taken in when it was parked: it is only dead-lettered now.
	own.deadLettered += int64(len(b.Malformed) + len(b.Deleted) + len(badRetries))
	for _, bad := range badRetries {
		c.args.Outputs = append(c.args.Outputs, r.deadLetterMalformed(n, w.u, &redis.MalformedEntryError{
			ID: bad.Entry.ID, Reason: "a member of the retry set cannot be decoded",
		}))
		*retryDone = append(*retryDone, bad)
	}
}

// messagesOf makes the messages of a batch's entries and due retries, in that order.
func (w *worker) messagesOf(b redis.Batch, due []redis.Retry) []*message {
	backing := make([]message, 0, len(b.Entries)+len(due))
	for _, e := range b.Entries {
		backing = append(backing, message{
			id:         e.ID,
			partition:  w.u.partition,
			inKey:      e.Key,
			inPayload:  e.Payload,
			msg:        w.entryMessage(e, true),
			trace:      traceOf(e),
			deliveries: e.Deliveries,
			attempts:   max(0, int(e.Deliveries)-1), // each earlier delivery was an attempt
		})
	}
	for i := range due {
		rt := &due[i]
		backing = append(backing, message{
			id:           rt.Entry.ID,
			partition:    w.u.partition,
			path:         rt.Path,
			msg:          w.entryMessage(rt.Entry, false),
			trace:        traceOf(rt.Entry),
			attempts:     rt.Attempts,
			firstFailure: rt.FirstFailure,
			retry:        rt,
		})
	}
	msgs := make([]*message, len(backing))
	for i := range backing {
		msgs[i] = &backing[i]
	}
	return msgs
}

// processMessages runs the batch's messages through the node and collects what to commit: their
// outputs and dead letters, their acks, and the retries to schedule, which it returns.
func (w *worker) processMessages(ctx context.Context, c *batchCommit, msgs []*message, retryDone *[]redis.Retry) []redis.Retry {
	n, r := w.u.node, w.r
	var retries []redis.Retry
	p := pass{retrySet: w.u.retryKey != "", stopping: ctx.Done()}
	if n.chain != nil {
		p.counts = c.counts // its stages count as the messages pass them (fusion.go)
	}
	own := &c.counts.nodes[0]
	for i, res := range r.processAll(n, msgs, p) {
		m := msgs[i]
		if res.abandoned {
			c.abandoned = true
			continue
		}
		if n.chain == nil || m.outcome == outcomeHandedOn {
			own.settle(m, &res, m.fresh())
		}
		c.args.Outputs = append(c.args.Outputs, res.outs...)
		c.args.Outputs = append(c.args.Outputs, res.deadLetters...)
		if gated := r.backpressure.gates; len(gated) > 0 {
			for j := range res.outs {
				if g := gated[res.outs[j].Stream]; g != nil {
					c.admits = append(c.admits, g)
				}
			}
		}
		for _, rt := range res.retries {
			retries = append(retries, rt)
			if rt.Due.Before(w.nextRetries) {
				w.nextRetries = rt.Due
			}
		}
		if m.retry != nil {
			*retryDone = append(*retryDone, *m.retry)
		} else {
			c.args.IDs = append(c.args.IDs, m.id)
		}
	}
	return retries
}

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
		w.backoff.wait(ctx, w.r)
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
