package runtime

import (
	"context"
	"math"
	"time"

	"github.com/flowrun/flowrun/runtime/backpressure"
	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A worker's batch, from what was read to what to commit: the entries that cannot be processed
// go to the dead letters, the messages are made with their watermarks and state, processed
// (lanes.go, layers.go), the due timers fire, and the batch becomes a batchCommit. Committing it
// is worker_commit.go; the loop that reads batches is worker.go.

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
	w.r.activity.add(1)
	return w.processCounted(ctx, b, due, badRetries)
}

// processCounted is process for a batch that its caller counted as work already, from before the
// reply that brought it (reclaim).
func (w *worker) processCounted(ctx context.Context, b redis.Batch, due, badRetries []redis.Retry) error {
	if w.time != nil {
		w.time.Begin()
	}
	return w.processBegun(ctx, b, due, badRetries)
}

// processBegun is processCounted once the batch's watermarks have begun (an idle turn moved them).
// It lets go of the batch's count of work (activity) once the batch is committed: its caller added
// it.
func (w *worker) processBegun(ctx context.Context, b redis.Batch, due, badRetries []redis.Retry) error {
	defer w.r.activity.add(-1)
	c := w.prepare(ctx, b, due, badRetries, nil)
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
	admits []*backpressure.Gate
	state  *state.Batch // a stateful stage's, whose outcomes count once the batch is committed
	// timeBefore is the unit's watermarks as they were before this batch's were made the next
	// batch's start (state.Watermarks.Ahead), while it commits: nil when no batch ran ahead.
	timeBefore *state.Watermarks
	// counts are what the batch did, counted once it is committed (outcomes.go); counted says
	// they were (commitOverlapped counts as soon as the commit ends).
	counts  *batchCounts
	counted bool
}

// prepare processes a batch (see process) and returns what to commit, or nil when there is
// nothing to commit or the batch must be delivered again. Its steps: the entries that cannot be
// processed go to the dead letters; the messages are made, with their watermarks (worker_time.go)
// and state; they are processed; the due timers fire; the watermarks go with the commit.
// committing is the batch before, whose commit is in flight meanwhile (commitOverlapped); nil when
// the batch before is committed.
func (w *worker) prepare(ctx context.Context, b redis.Batch, due, badRetries []redis.Retry, committing *batchCommit) *batchCommit {
	w.uncertain.readAgain(b)
	c := &batchCommit{counts: newBatchCounts(w.u.node)}
	total := b.Len() + len(due) + len(badRetries)
	// The batch's outputs (most stages write one per input) and acks reuse the memory of the last
	// batch committed, and its messages that of the last batch: the steady state makes none afresh.
	c.args = w.commitMemory(w.u.node.outputsPer(total), total)
	var retryDone []redis.Retry
	w.deadLetterUnreadable(c, b, badRetries, &retryDone)
	msgs := w.messagesOf(b, due)
	if err := w.beginState(c, msgs, b.Len() > 0, committing); err != nil {
		return w.again(ctx, "reading the watermark or the state's keys failed; the batch will be processed again", err)
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
// stateful stage's batch state, over the state of the batch committing before it, with the keys
// its messages will read fetched at once. A batch that was read is processed and committed
// whether or not the worker stops meanwhile: its reads too, within the drain time (the runner's
// hard context).
func (w *worker) beginState(c *batchCommit, msgs []*message, read bool, committing *batchCommit) error {
	n, hard := w.u.node, w.r.hard
	// The kind names its keys first: it decodes and keeps the fields it reads of each message, and
	// the event times that the watermarks read then decode nothing more.
	var keys []string
	if n.stateful && n.prefetch != nil {
		for _, m := range msgs {
			keys = n.prefetch.StateKeys(&m.msg, keys)
		}
	}
	watermarks, err := w.beginTime(hard, msgs, read)
	if err != nil || !n.stateful {
		return err
	}
	if c.state, w.committedState = w.committedState, nil; c.state != nil {
		c.state.Reuse()
	} else {
		c.state = state.NewBatch(w.r.rdb, w.stateKeys, w.u.partition, w.held, w.packed)
	}
	if err := w.packed.Load(hard, w.r.rdb, w.stateKeys.Hash); err != nil {
		return err
	}
	w.loadHeldKeys()
	if committing != nil {
		c.state.Over(committing.state)
	}
	for i, m := range msgs {
		m.state, m.watermark = c.state, watermarks[i]
	}
	if len(keys) > 0 {
		c.state.Prefetch(hard, keys)
	}
	return nil
}

// loadHeldKeys starts loading the keys the partition's state holds (state.HeldKeys), when they
// were not loaded in this lease, were forgotten, or hold too many deleted keys. The load runs
// beside the batches, which read the state as before until it is done; one that fails is tried
// again at a later batch.
func (w *worker) loadHeldKeys() {
	if !w.held.Wants() {
		return
	}
	w.loads.Go(func() {
		if err := w.held.Load(w.loadCtx, w.r.rdb, w.stateKeys.Hash); err != nil && w.loadCtx.Err() == nil {
			w.u.node.log.Debug("reading the keys of the state failed; it is read key by key meanwhile",
				"stream", w.u.stream, "err", err)
		}
	})
}

// endState ends it, once the batch's messages are processed: the writers' minimum read before the
// batch counts, the timers due fire (those left over fire next turn), and the marks to pass on go
// with the commit. An error says why the batch must be processed again.
func (w *worker) endState(c *batchCommit, b redis.Batch) (string, error) {
	n, hard := w.u.node, w.r.hard
	if w.time != nil && b.Len() > 0 {
		w.time.Reached(redis.MaxID(b.IDs()))
	}
	var timersLeft, waiting int64
	if n.timers != nil {
		at := w.timerWatermark()
		if n.tableTime != nil {
			var err error
			if at, err = n.tableTime.watermark(hard); err != nil {
				return "reading the watermark of the table failed; the batch will be processed again", err
			}
		}
		fired, deadLetters, left, err := w.fireTimers(hard, n.timers, c.state, at)
		if err != nil {
			// The batch's state may be half way through its timers.
			return "firing the due timers failed; the batch will be processed again", err
		}
		c.args.Outputs = append(c.args.Outputs, fired...)
		c.counts.nodes[0].written += int64(len(fired) - deadLetters) // a timer's results are entries written, no message's outcome
		timersLeft = left
		if n.tableTime != nil && left == 0 {
			if waiting, err = w.waitingForTable(c.state); err != nil {
				return "reading the timers that wait for the table failed; the batch will be processed again", err
			}
		}
	}
	w.timersDue, w.tableWaits = timersLeft > 0, waiting > 0
	marks, err := w.endTime(hard, c.state, max(timersLeft, waiting))
	if err != nil {
		return "reading the holds of the watermark failed; the batch will be processed again", err
	}
	c.args.Marks = marks
	return "", nil
}

// waitingForTable returns the time of the earliest timer of a stage whose timers follow a table's
// watermark (node.tableTime) that is not due yet, 0 when none waits: the unit then turns while
// idle, to fire it once the table's watermark moves, and its input does not close before.
func (w *worker) waitingForTable(st *state.Batch) (int64, error) {
	next, err := st.DueTimers(w.r.hard, math.MaxInt64, 1, nil)
	if err != nil || len(next) == 0 {
		return 0, err
	}
	return next[0].At, nil
}

// finishBatch makes a processed batch a commit: nil when it has nothing to make durable, or when
// its deliveries cannot be made durable (it is delivered again).
func (w *worker) finishBatch(ctx context.Context, c *batchCommit, retryDone, retries []redis.Retry) *batchCommit {
	n := w.u.node
	c.state.Settled() // the batch has read all it reads
	c.args.State = c.state.Writes()
	if raw := w.measured(); raw != nil {
		if c.args.State == nil {
			c.args.State = &redis.StateWrites{Key: w.stateKeys.Hash}
		}
		if c.args.State.Set == nil {
			c.args.State.Set = map[string][]byte{}
		}
		c.args.State.Set[redis.MeasuredField] = raw
	}
	if len(c.args.IDs) == 0 && len(c.args.Outputs) == 0 && len(retryDone) == 0 && len(retries) == 0 && c.args.State == nil &&
		len(c.args.Marks) == 0 {
		w.timeCommitted() // nothing to make durable: what the watermarks did holds
		return nil
	}
	if err := n.handler.flush(w.r.hard); err != nil {
		// What was delivered may not be durable: acking it could lose it. Deliver the batch again.
		w.r.log.Error("making deliveries durable failed; the batch will be delivered again", "node", n.name, "err", err)
		w.recover, w.recovery = true, ""
		w.backoff.wait(ctx, w.r.clock, &w.r.jitter)
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
	w.redisWentAway() // what failed reads Redis
	w.backoff.wait(ctx, w.r.clock, &w.r.jitter)
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
	backing, msgs := w.messageMemory(len(b.Entries) + len(due))
	for _, e := range b.Entries {
		backing = append(backing, message{
			id:          e.ID,
			partition:   w.u.partition,
			inKey:       e.Key,
			inPayload:   e.Payload,
			msg:         w.entryMessage(e, true),
			trace:       traceOf(e),
			deliveries:  e.Deliveries,
			redelivered: b.Redelivered,
			attempts:    max(0, int(e.Deliveries)-1), // each earlier delivery was an attempt
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
	for i := range backing {
		msgs = append(msgs, &backing[i])
	}
	w.reuse(backing, msgs)
	return msgs
}

// commitMemory returns the outputs and acks of a batch's commit, empty, with room for the given
// counts: those of the last batch committed, when they have it.
func (w *worker) commitMemory(outputs, ids int) redis.CommitArgs {
	a := redis.CommitArgs{Outputs: w.spare.Outputs, IDs: w.spare.IDs}
	w.spare = redis.CommitArgs{}
	if cap(a.Outputs) < outputs {
		a.Outputs = make([]redis.Output, 0, outputs)
	}
	if cap(a.IDs) < ids {
		a.IDs = make([]string, 0, ids)
	}
	return a
}

// keepCommitMemory keeps the outputs and acks of a batch whose commit ended well for a later
// batch's (commitMemory), emptied so that they keep no payload alive. Nothing reads them any more:
// only a commit of unknown outcome is kept (uncertainCommits).
func (w *worker) keepCommitMemory(c *batchCommit) {
	clear(c.args.Outputs)
	clear(c.args.IDs)
	w.spare = redis.CommitArgs{Outputs: c.args.Outputs[:0], IDs: c.args.IDs[:0]}
}

// batchMemory is the memory of a worker's last batch of messages, which the next batch reuses.
// A worker processes and commits one batch at a time, and nothing holds a node's messages once
// their batch is committed: its outputs, dead letters and retries are copies, a stateful stage's
// state writes are encoded values and its batch state ends with the batch, and a kind gets a
// message for the call only (stages.StatefulProcessor). A thousand messages are half a megabyte
// to allocate, clear and collect at every hop otherwise.
type batchMemory struct {
	msgs []message
	ptrs []*message
}

// messageMemory returns empty slices with room for n messages and pointers to them.
func (w *worker) messageMemory(n int) ([]message, []*message) {
	if cap(w.mem.msgs) < n {
		return make([]message, 0, n), make([]*message, 0, n)
	}
	return w.mem.msgs[:0], w.mem.ptrs[:0]
}

// reuse keeps a batch's messages for the next batch, and clears those of the last batch that
// this one did not overwrite, so that they keep no payload alive.
func (w *worker) reuse(msgs []message, ptrs []*message) {
	if len(msgs) < len(w.mem.msgs) && cap(msgs) == cap(w.mem.msgs) {
		clear(msgs[len(msgs):len(w.mem.msgs)])
	}
	w.mem = batchMemory{msgs: msgs, ptrs: ptrs}
}

// processMessages runs the batch's messages through the node and collects what to commit: their
// outputs and dead letters, their acks, and the retries to schedule, which it returns.
func (w *worker) processMessages(ctx context.Context, c *batchCommit, msgs []*message, retryDone *[]redis.Retry) []redis.Retry {
	n, r := w.u.node, w.r
	var retries []redis.Retry
	p := pass{retrySet: w.u.retryKey != "", stopping: ctx.Done()}
	if n.chain != nil {
		p.counts = c.counts // its stages count as the messages pass them (fused.go)
	}
	own := &c.counts.nodes[0]
	switch h := n.handler.(type) {
	case *sinkHandler:
		h.deliverBatch(r.hard, msgs) // a sink that takes batches delivers the batch at once
	case *stageHandler:
		h.readBatch(r.hard, msgs) // a lookup reads its batch's rows at once
	}
	for i, res := range r.processAll(n, msgs, p, &w.lanes) {
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
		if gated := r.backpressure.Gated(); len(gated) > 0 {
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
