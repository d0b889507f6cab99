package runtime

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sourcegraph/conc"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/state"
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
	// stateKeys are a stateful stage's keys on the unit's partition; for a unit that measures its
	// input's watermark, the state hash only, where it keeps what it measured.
	stateKeys state.Keys
	// uncertain holds the counts of commits whose reply was lost until the recovery tells whether
	// they were applied (worker_commit.go).
	uncertain uncertainCommits
	// timersDue: the last batch left timers due that it had no room to fire; the next turn, with
	// or without messages, fires them (fireTimers).
	timersDue bool
	// tableWaits: timers of the unit wait for the watermark of a table (node.tableTime), which no
	// entry of its input moves: each idle turn (every Options.Block) looks whether it has.
	tableWaits bool
	// lastReclaim is when the worker last took over what other consumers left pending.
	lastReclaim time.Time
	// mem is the memory of the last batch's messages, which the next reuses (worker_batch.go);
	// lanes that of its results and outputs (lanes.go), and spare that of the outputs and acks of
	// the last batch committed (commitMemory). Made afresh, these were most of a hop's allocations.
	mem   batchMemory
	lanes laneMemory
	spare redis.CommitArgs
	// committedState is a stateful stage's last committed batch state, whose memory the next
	// batch's reuses (beginState); nil after a commit that did not end well.
	committedState *state.Batch
	// held is what a stateful stage knows of the keys its partition's state holds, for this
	// lease (state.HeldKeys): loaded by a scan in the background (loads, ended with the worker
	// by stopLoads), and kept by the worker's commits. A stage that packs its keys has packed
	// instead (state.PackedKeys): all its keys, read before the first batch of the lease and
	// again after a failed commit. Each is nil for the other.
	held      *state.HeldKeys
	packed    *state.PackedKeys
	loads     conc.WaitGroup
	loadCtx   context.Context
	stopLoads context.CancelFunc
}

func newWorker(r *runner, u *unit, lease *redis.Lease) *worker {
	// A unit whose timers follow a table may have messages waiting from another owner, with no
	// entry to come that would fire them: its first idle turn looks.
	w := &worker{r: r, u: u, lease: lease, tableWaits: u.node.tableTime != nil}
	if spec := r.timeSpec(u); spec != nil {
		w.time, w.stamps = state.NewWatermarks(*spec), stampsEntryTime(spec)
	}
	switch n := u.node; {
	case n.stateful:
		w.stateKeys = state.Keys{Hash: r.keys.State(n.input.Name, u.partition, n.name),
			Timers: r.keys.Timers(n.input.Name, u.partition, n.name), Holds: r.keys.Holds(n.input.Name, u.partition, n.name)}
		if n.packsKeys {
			w.packed = state.NewPackedKeys()
		} else {
			w.held = state.NewHeldKeys()
		}
	case w.time != nil && w.time.Measures() && n.input != nil:
		// What it measures is kept in a state hash of its own (state.Watermarks.Resume).
		w.stateKeys = state.Keys{Hash: r.keys.State(n.input.Name, u.partition, n.name)}
	}
	return w
}

// run reads, processes and commits batches until ctx ends (the process stops or gives the unit up).
// A batch that was read is always processed and committed, within the runner's drain time.
func (w *worker) run(ctx context.Context) error {
	started := sync.OnceFunc(func() { w.r.activity.add(-1) }) // see ownership.startWorkerLocked
	defer started()
	n := w.u.node
	leave := n.reads.join()
	defer leave()
	w.loadCtx, w.stopLoads = context.WithCancel(ctx)
	defer w.loads.Wait()
	defer w.stopLoads()
	if !w.ensureGroup(ctx) {
		return nil
	}
	started() // it has sent a command: what follows counts as work on its own (process, reads)
	if !w.waitForTables(ctx) {
		return nil
	}
	if w.lease != nil {
		// Entries another owner left pending are older than anything new: they go first.
		if err := w.reclaim(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	w.lastReclaim = w.r.clock.Now()
	args := redis.ReadArgs{Stream: w.u.stream, Group: n.group, Consumer: w.r.opts.ProcessID,
		Count: n.readCount, Block: w.r.opts.Block}
	var ahead *readResult // the next batch, read while the last one was committed
	for ctx.Err() == nil {
		if ahead != nil && ahead.processed {
			// Processed while the batch before committed: it commits before anything else is
			// processed, which may read what it writes.
			var err error
			if ahead, err = w.commitProcessed(ctx, ahead.prepared, args); err != nil {
				return err
			}
			continue
		}
		if w.retriesDue() {
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
		w.r.outage.OK()
		w.backoff.reset()
		if batch.Len() > 0 {
			if ahead, err = w.processReadingAhead(ctx, batch, args); err != nil {
				return err
			}
		} else if err := w.idleTurn(ctx); err != nil {
			return err
		}
		if ahead == nil || !ahead.processed {
			if err := w.reclaimIdle(ctx); err != nil {
				return err
			}
		}
	}
	if ahead != nil && ahead.processed && ahead.prepared != nil {
		return w.commit(ctx, ahead.prepared) // processed just before the stop
	}
	if ahead != nil && !ahead.processed && ahead.err == nil && ahead.batch.Len() > 0 {
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
		args.Count = w.u.node.reads.count(args.Count)
		batch, err = w.r.rdb.ReadPending(ctx, args, w.recovery)
		if err == nil {
			if batch.Len() == 0 {
				w.recover, w.recovery = false, ""
				w.uncertain.settle(w)
				return batch, true, nil
			}
			ids := batch.IDs()
			w.recovery = redis.MaxID(ids)
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
	w.redisWentAway()
	w.backoff.wait(ctx, w.r.clock, &w.r.jitter)
	return true
}

// redisWentAway forgets what the worker knows of its partition's state (state.HeldKeys,
// state.PackedKeys) when a command failed: Redis may have restarted and lost its last writes (the
// last second of an append-only file), which the worker would still take for the state's.
func (w *worker) redisWentAway() {
	w.held.Forget()
	w.packed.Forget()
}

// reclaimIdle takes over what another consumer left pending, once it has been idle long enough
// that nobody is still working on it: a dead consumer of a partition without leases, or a process
// that read a batch just before it noticed it had lost this partition's lease.
func (w *worker) reclaimIdle(ctx context.Context) error {
	if w.reclaimDue() {
		if err := w.reclaim(ctx, w.u.node.claimIdle); err != nil {
			return err
		}
		w.lastReclaim = w.r.clock.Now()
	}
	return nil
}

// reclaimDue reports whether it is time to look for what other consumers left pending.
func (w *worker) reclaimDue() bool {
	return w.r.clock.Now().Sub(w.lastReclaim) > w.u.node.claimIdle
}

// retriesDue reports whether it is time to look at the unit's retry set.
func (w *worker) retriesDue() bool {
	return w.u.retryKey != "" && !w.r.clock.Now().Before(w.nextRetries)
}

// readArgs returns the arguments of the next read: args, taking the unit's share of the node's
// reads (readshare.go), waiting for new entries no longer than until the next retry is due.
func (w *worker) readArgs(args redis.ReadArgs) redis.ReadArgs {
	args.Count = w.u.node.reads.count(args.Count)
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

// readResult is a read's batch or error; or, where the worker processed it while the batch before
// committed (commitOverlapped), what it made of the batch: processed, and the commit it prepared.
type readResult struct {
	batch     redis.Batch
	err       error
	processed bool
	prepared  *batchCommit // nil: nothing to commit, or the batch is to be processed again
}

// processReadingAhead processes a batch read from the stream, and commits it while it reads the
// next one: Redis works on both at once, and the next batch is there when the commit is done (the
// sequence read, process, commit, read leaves Redis and the process waiting for each other in
// turn). A unit of a node that this process runs on more partitions than read full batches
// (readshare.go) does not read ahead: those units' turns overlap one another. It returns the batch
// read ahead; nil when nothing was, or when the commit did not end well: the entries that read
// delivered are then pending for this consumer, and the recovery the failed commit started (or,
// when the partition is lost, its new owner) reads them again.
func (w *worker) processReadingAhead(ctx context.Context, b redis.Batch, args redis.ReadArgs) (*readResult, error) {
	w.r.activity.add(1)
	defer w.r.activity.add(-1)
	if w.time != nil {
		w.time.Begin()
	}
	return w.commitReadingAhead(ctx, w.prepare(ctx, b, nil, nil, nil), args)
}

// commitProcessed commits a batch that the worker processed while the batch before committed
// (commitOverlapped), reading the next meanwhile.
func (w *worker) commitProcessed(ctx context.Context, c *batchCommit, args redis.ReadArgs) (*readResult, error) {
	w.r.activity.add(1)
	defer w.r.activity.add(-1)
	return w.commitReadingAhead(ctx, c, args)
}

// commitReadingAhead commits a processed batch (see processReadingAhead), while it reads the next.
func (w *worker) commitReadingAhead(ctx context.Context, c *batchCommit, args redis.ReadArgs) (*readResult, error) {
	if c == nil {
		return nil, nil
	}
	if w.recover || ctx.Err() != nil || !w.u.node.reads.ahead() {
		return nil, w.commit(ctx, c)
	}
	read := w.readArgs(args)
	ahead := make(chan readResult, 1)
	go func() {
		b, err := w.r.rdb.ReadGroup(ctx, read)
		ahead <- readResult{batch: b, err: err}
	}()
	if w.overlaps(c) {
		return w.commitOverlapped(ctx, c, ahead)
	}
	err := w.commit(ctx, c)
	next := w.awaitRead(ahead)
	if err != nil || w.recover {
		return nil, err
	}
	return &next, nil
}

// awaitRead waits for the batch read ahead, as a worker that waits: the read may wait on the
// clock for entries.
func (w *worker) awaitRead(ahead <-chan readResult) readResult {
	done := w.r.activity.waiting()
	defer done()
	return <-ahead
}

// overlaps reports whether the worker processes the batch it reads ahead while c commits
// (commitOverlapped). A stage does, at least once: a sink delivers outside Redis, and
// effectively-once outputs are left as they are. Not when a retry or a takeover of pending entries
// is due next: the batch read ahead then waits for them, as it would without overlap, and a
// stateful stage's retries and takeovers read the state c writes. Nor after a stop abandoned
// some of c's messages: the batches after it are given up.
func (w *worker) overlaps(c *batchCommit) bool {
	n := w.u.node
	_, stage := n.handler.(*stageHandler)
	return stage && n.delivery != flow.EffectivelyOnce && !c.abandoned && !w.retriesDue() && !w.reclaimDue()
}

// commitOverlapped commits c while it processes the batch that ahead brings: a unit's turns then
// keep the process and Redis busy at once, where the commit's round trip left the process waiting
// and processing left Redis idle. The batch starts from what c leaves: its watermarks from c's
// (state.Watermarks.Ahead), and a stateful stage's state from c's writes over what Redis holds
// (state.Batch.Over). Its commit is sent after c's has ended well, as the next turn's (its outputs
// after c's in every stream). When c's commit does not end well, the batch is given up as a batch
// read ahead is: its entries are pending for this consumer, and the recovery (or the partition's
// new owner) reads them again; the watermarks go back to what they were before c.
func (w *worker) commitOverlapped(ctx context.Context, c *batchCommit, ahead <-chan readResult) (*readResult, error) {
	if err := w.admit(ctx, c.admits); err != nil {
		<-ahead
		return nil, err
	}
	sent := make(chan error, 1)
	go func() {
		_, err := w.r.rdb.Commit(w.r.hard, c.args)
		if err == nil && !c.abandoned {
			// What the batch did counts as soon as it is written, not once the next batch is
			// processed, which may wait on retries: a reader of the metrics that saw the outputs
			// downstream sees them counted here. (Counting touches nothing of the worker's.)
			w.counted(c)
			c.counted = true
		}
		sent <- err
	}()
	select {
	case next := <-ahead:
		if next.err == nil && next.batch.Len() > 0 && !w.recover && ctx.Err() == nil {
			if w.time != nil {
				c.timeBefore = w.time.Ahead()
				w.time.Begin()
			}
			next.processed, next.prepared = true, w.prepare(ctx, next.batch, nil, nil, c)
		}
		// A batch processed over a commit that did not end well is given up, whatever comes of
		// it: it started from what that commit would have written.
		sentErr := <-sent
		if err := w.committed(ctx, c, sentErr); err != nil || sentErr != nil || w.recover {
			return nil, err
		}
		return &next, nil
	case err := <-sent:
		// The commit ended before the read: what came of it counts at once, and the batch read
		// ahead is processed next turn, as without overlap.
		err = w.committed(ctx, c, err)
		next := w.awaitRead(ahead)
		if err != nil || w.recover {
			return nil, err
		}
		return &next, nil
	}
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
			w.r.outage.OK()
			w.backoff.reset()
			return true
		}
		if ctx.Err() != nil || !w.r.redisFailed(w.u.node.typ+" "+w.u.node.name+" creating its consumer group on "+w.u.stream, err) {
			return false
		}
		w.backoff.wait(ctx, w.r.clock, &w.r.jitter)
	}
	return false
}

// reclaim takes over the entries of the group pending for at least minIdle, page by page, and
// processes them.
func (w *worker) reclaim(ctx context.Context, minIdle time.Duration) error {
	n := w.u.node
	start := "0-0"
	for ctx.Err() == nil {
		// The entries it takes are work from the reply on, without a gap: those deleted while
		// pending leave the pending list with it, and only this batch holds them until their dead
		// letters commit (a job's end test that found nothing pending meanwhile would end the job).
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
			w.redisWentAway()
			w.backoff.wait(ctx, w.r.clock, &w.r.jitter)
			continue
		}
		if res.Len() > 0 {
			w.r.log.Info("took over pending entries", "node", n.name, "stream", w.u.stream, "entries", res.Len())
			// The batch takes the count over (see above): it is the batch's only one, so that a
			// wait inside it (a paused sink's probe) lets go of all there is.
			if err := w.processCounted(ctx, res.Batch, nil, nil); err != nil {
				return err
			}
		} else {
			w.r.activity.add(-1)
		}
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
