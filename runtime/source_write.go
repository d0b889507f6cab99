package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/flowrun/flowrun/runtime/backpressure"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A producing source hands its entries to a sourceWriter, which writes them in batches, in order,
// one batch at a time: up to its batch size of entries, or what arrived within sourceLinger of the first.
// A batch that fails is written again, with backoff, until Redis takes it (nothing is dropped on a
// transient error), the failure turns out to be one that waiting does not heal, or the drain time
// of a stop runs out. While it waits, the channel fills and the source blocks: it is held back
// instead of piling messages up in memory. Only written entries are counted: a source's in is what
// it produced and Redis took, its out the messages written to its topic, its dead letters what it
// rejected (outcomes.go).
//
// A group of entries that a source emits together (stages.Emitter.EmitAll, source_produce.go) is
// queued as one item and written in one batch, whatever the batch size: one transaction on a single
// server. The writer tells the group's waiter once the batch is written, with the entries' IDs, and
// when an attempt to write it fails; it goes on trying either way, as for any batch.

const (
	// sourceLinger bounds how long an entry waits for others to share its batch, so that a slow
	// source (a person typing into stdin, a generate source with a low rate) is not delayed.
	sourceLinger = 2 * time.Millisecond
)

var (
	// errSourceLeaseLost stops a source whose lease another process took: its checkpoint cannot
	// move any more, and the other process produces from there.
	errSourceLeaseLost = errors.New("source lease lost")
	// errWriterStopped is what a source gets when it adds to a writer that has stopped; the
	// writer's own error says why.
	errWriterStopped = errors.New("the source's writer stopped")
)

// sourceItem is one entry a source produced.
type sourceItem struct {
	out      redis.Output
	rejected bool // a dead letter, not a message for the output topic
	// position is the source's checkpoint once this entry is written; "" for sources without.
	position string
	gate     *backpressure.Gate // the cap of the partition it goes to, if any: it was let through
	// times are its event times, per domain of the source's watermarks (source_time.go).
	times []int64
	// group is the group the entry belongs to (EmitAll), and index its place there; nil for Emit.
	group *sourceGroup
	index int
	// all, when set, makes the item stand for a whole group in the writer's queue: the writer puts
	// the group's entries in its batch at once. Its other fields are unused.
	all *sourceGroup
}

// sourceGroup is the entries of one EmitAll call, and how writing them went.
type sourceGroup struct {
	items []sourceItem
	ids   []string // the entries' IDs, set before written closes
	// written is closed once the batch that holds the group is written; failed when an attempt
	// to write it fails (the writer tries again: it may still be written).
	written    chan struct{}
	failed     chan struct{}
	failedOnce sync.Once
}

func newSourceGroup(n int) *sourceGroup {
	return &sourceGroup{items: make([]sourceItem, n), ids: make([]string, n),
		written: make(chan struct{}), failed: make(chan struct{})}
}

// release tells the gates that the group's entries, let through, will not be written.
func (g *sourceGroup) release() {
	for _, it := range g.items {
		if it.gate != nil {
			it.gate.Dropped(1)
		}
	}
}

// sourceWriter writes a producing source's entries.
type sourceWriter struct {
	ctx context.Context // the source's: waiting at a capped topic ends with it
	r   *sourceRun
	src *producingSource
	own *ownership
	// most is the most entries it writes at once: what a pipelined round trip amortises well
	// (transport/redis DefaultBatchSize), or fewer when the run's batches are smaller
	// (Options.BatchSize), so that its watermarks move as a stage's do.
	most    int
	outputs []redis.Output // the outputs of the batch being written (write)
	items   chan sourceItem
	stopped chan struct{} // closed when the writer ends
	err     error         // why it ended, set before stopped closes
}

func (r *sourceRun) startSourceWriter(ctx context.Context, p *producingSource, own *ownership) *sourceWriter {
	most := min(redis.DefaultBatchSize, r.opts.BatchSize)
	w := &sourceWriter{ctx: ctx, r: r, src: p, own: own, most: most, items: make(chan sourceItem, 2*most), stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		w.err = w.run()
	}()
	return w
}

// add queues an entry, waiting while the writer is behind.
func (w *sourceWriter) add(ctx context.Context, it sourceItem) error {
	// Most often the queue has room: a send that looks at one channel, rather than a select
	// that locks three, for every entry a source produces.
	select {
	case w.items <- it:
		w.src.unwritten.Add(1)
		return nil
	default:
	}
	select {
	case w.items <- it:
		w.src.unwritten.Add(1)
		return nil
	case <-w.stopped:
		return errWriterStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// addAll queues a group of entries, let through their gates already, as one item; while the
// writer is behind it waits, until ctx ends. On an error nothing of the group is queued.
func (w *sourceWriter) addAll(ctx context.Context, g *sourceGroup) error {
	w.src.unwritten.Add(int64(len(g.items)))
	select {
	case w.items <- sourceItem{all: g}:
		return nil
	case <-w.stopped:
		w.src.unwritten.Add(-int64(len(g.items)))
		return errWriterStopped
	case <-ctx.Done():
		w.src.unwritten.Add(-int64(len(g.items)))
		return ctx.Err()
	}
}

// close writes what was added and returns why the writer stopped, if it stopped early.
func (w *sourceWriter) close() error {
	close(w.items)
	<-w.stopped
	return w.err
}

func (w *sourceWriter) run() error {
	batch := make([]sourceItem, 0, w.most)
	linger := w.r.clock.NewTimer(time.Hour)
	linger.Stop()
	for {
		it, ok := <-w.items
		if !ok {
			return nil
		}
		var err error
		if batch, err = w.append(batch[:0], it); err != nil {
			return err
		}
		linger.Reset(sourceLinger)
	fill:
		for len(batch) < w.most {
			var it sourceItem
			var ok bool
			select {
			case it, ok = <-w.items: // most often waiting already: the timer is not looked at
			default:
				select {
				case it, ok = <-w.items:
				case <-linger.C():
					break fill
				}
			}
			if !ok {
				break fill
			}
			if batch, err = w.append(batch, it); err != nil {
				return err
			}
		}
		linger.Stop()
		if err := w.write(batch); err != nil {
			return err
		}
		clear(batch)
	}
}

// append adds an entry to the batch once its partition has room (backpressure). While it has none,
// the batch so far is written first: it holds back nothing of what waits.
func (w *sourceWriter) append(batch []sourceItem, it sourceItem) ([]sourceItem, error) {
	if it.all != nil {
		return append(batch, it.all.items...), nil // let through by EmitAll, whole
	}
	if it.rejected {
		return append(batch, it), nil
	}
	bp := w.r.backpressure
	if it.gate = bp.Gate(it.out.Stream); it.gate == nil {
		return append(batch, it), nil
	}
	if ok, err := bp.TryAdmit(w.ctx, it.gate, 1); err != nil {
		return batch, err
	} else if ok {
		return append(batch, it), nil
	}
	if len(batch) > 0 {
		if err := w.write(batch); err != nil {
			return batch, err // it was not let through: nothing to drop
		}
		clear(batch)
		batch = batch[:0]
	}
	if err := bp.Admit(w.ctx, it.gate, 1, w.src.node); err != nil {
		if w.ctx.Err() == nil {
			return batch, err
		}
		it.gate.LetThrough(1) // a stop still writes what the source produced
	}
	return append(batch, it), nil
}

// drop tells the gates that entries let through will not be written.
func (w *sourceWriter) drop(items []sourceItem) {
	w.src.unwritten.Add(-int64(len(items)))
	for _, it := range items {
		if it.gate != nil {
			it.gate.Dropped(1)
		}
	}
}

// write writes one batch, again and again while Redis fails. It uses the runner's hard context, so
// that a stop still writes what the source produced, within the drain time.
func (w *sourceWriter) write(batch []sourceItem) error {
	r, n := w.r, w.src.node
	// The outputs' slice is the writer's, for every batch: a new one each time was a tenth of the
	// bytes a pass-through job allocated. Nothing keeps it past the commit.
	w.outputs = slices.Grow(w.outputs[:0], len(batch))[:len(batch)]
	defer clear(w.outputs) // let the payloads go
	args := redis.CommitArgs{Outputs: w.outputs, DedupTTL: *r.dedupTTL}
	var written counts
	for i, it := range batch {
		args.Outputs[i] = it.out
		if it.rejected {
			written.deadLettered++
		} else {
			written.out++
		}
	}
	written.in, written.written = int64(len(batch)), written.out
	if pos := batch[len(batch)-1].position; pos != "" {
		args.Checkpoint = &redis.Checkpoint{Key: w.src.positionKey, Value: pos}
	}
	var b backoff
	for {
		if args.Checkpoint != nil {
			lease, ok := w.own.sourceLease(w.src.leaseKey)
			if !ok {
				w.drop(batch)
				return errSourceLeaseLost
			}
			args.Lease = &lease
		}
		var ids []string
		var err error
		if t := w.src.time; t != nil {
			err = t.write(batch, &args, func() (err error) { ids, err = r.rdb.Commit(r.hard, args); return err })
		} else {
			ids, err = r.rdb.Commit(r.hard, args)
		}
		switch {
		case err == nil:
			r.outage.OK()
			n.stats.count(&written)
			w.src.unwritten.Add(-int64(len(batch)))
			for i, it := range batch {
				if it.gate != nil {
					it.gate.Written(1)
				}
				if g := it.group; g != nil {
					if i < len(ids) {
						g.ids[it.index] = ids[i]
					}
					if it.index == len(g.items)-1 { // a group is in one batch, in order
						close(g.written)
					}
				}
			}
			return nil
		case errors.Is(err, redis.ErrLeaseLost) && args.Lease != nil:
			if _, ok := w.own.retakeSource(r.hard, w.src.leaseKey, *args.Lease); ok {
				continue // the lease had expired and nobody took it: write the batch under the new one
			}
			w.drop(batch)
			return errSourceLeaseLost
		case redis.Unrecoverable(err):
			w.drop(batch)
			return fmt.Errorf("writing its messages: %w", err)
		case r.hard.Err() != nil:
			w.drop(batch)
			return fmt.Errorf("the drain time ran out before %d messages could be written, %s (%w)", len(batch), w.src.onRestart(), err)
		}
		r.outage.Failed("source "+n.name+" writing its messages", err)
		for _, it := range batch {
			if g := it.group; g != nil && it.index == 0 {
				g.failedOnce.Do(func() { close(g.failed) })
			}
		}
		b.wait(r.hard, r.clock, &r.jitter)
	}
}
