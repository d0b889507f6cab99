package runtime

import (
	"context"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// A stateful stage that reads a repartition topic (flow.RepartitionKind) has many writers per
// partition: every partition of the repartition stage's input writes to every partition of the
// topic, each at its own pace. Its watermark is not the latest event time it has seen, which a
// fast writer would move past a slow writer's events, making them late: it is the minimum of its
// writers' watermarks, as Flink takes the minimum over an operator's input channels.
//
// A writer's watermark is the repartition stage's, in its own state (the latest event time its
// input partition has seen, moving with the clock once that partition is idle). It counts only
// once the reader has processed everything the writer wrote before it: the reader reads the
// watermarks, then the position of its own stream, and raises its watermark once it has processed
// its stream up to there (the batch that reaches it, or an idle turn with no backlog). A writer
// that has seen nothing yet holds the minimum back until it has been idle for its idle timeout
// (redis.IdleField), as an idle partition's watermark moves only after it; it is then left out.
//
// The stage's own observations do not move its watermark; its idle timeout is its writers'.

// writer is one partition of a repartition stage's input, as the reader of the repartition topic
// sees it: the repartition stage's state hash on that partition, which holds its watermark.
type writer struct{ state string }

// writersOf lists the writers of a stateful node's input; nil unless it is a repartition topic.
func (r *runner) writersOf(n *node) []writer {
	rs := n.input.Repartition
	if rs == nil || !n.stateful {
		return nil
	}
	ws := make([]writer, rs.Input.Partitions)
	for p := range ws {
		ws[p] = writer{state: r.keys.State(rs.Input.Name, p, rs.Name)}
	}
	return ws
}

// writersWatermark is the minimum of the node's writers' watermarks, in Unix ms; false when no
// writer has one yet, or one that has none has not been idle for its idle timeout yet.
func (w *worker) writersWatermark(ctx context.Context) (int64, bool, error) {
	ws := w.u.node.writers
	hashes := make([]string, len(ws))
	for i, wr := range ws {
		hashes[i] = wr.state
	}
	wms, err := w.r.rdb.ReadWatermarks(ctx, hashes)
	if err != nil {
		return 0, false, err
	}
	least, found := int64(0), false
	for _, wm := range wms {
		switch {
		case wm.At > 0:
			if !found || wm.At < least {
				least, found = wm.At, true
			}
		case !wm.Idle:
			return 0, false, nil
		}
	}
	return least, found, nil
}

// followWriters takes the writers' watermark before a batch is processed: it counts once the
// batch has processed the stream up to where it stood (raiseAfter).
func (w *worker) followWriters(ctx context.Context) {
	if w.writersPending {
		return
	}
	wm, ok, err := w.writersWatermark(ctx)
	if err != nil || !ok || wm <= w.raisedTo {
		if err != nil {
			w.u.node.log.Debug("cannot read the watermarks of the repartition topic's writers", "err", err)
		}
		return
	}
	until, err := w.r.rdb.LastID(ctx, w.u.stream)
	if err != nil {
		return
	}
	w.writersWM, w.writersUntil, w.writersPending = wm, until, true
}

// raiseAfter raises the batch's watermark to the writers' once the batch has processed the stream
// up to where it stood when they were read (followWriters).
func (w *worker) raiseAfter(b redis.Batch) {
	if !w.writersPending || b.Len() == 0 {
		return
	}
	if c, err := redis.CompareIDs(maxID(b.IDs()), w.writersUntil); err == nil && c >= 0 {
		w.raiseTo, w.writersPending = w.writersWM, false
	}
}

// idleWithWriters raises the watermark of a caught-up partition to its writers': with nothing to
// read and no backlog, everything they wrote before their watermarks has been processed.
func (w *worker) idleWithWriters(ctx context.Context) error {
	wm, ok, err := w.writersWatermark(ctx)
	if err != nil || !ok || wm <= w.raisedTo {
		return nil
	}
	backlog, err := w.r.rdb.Backlog(ctx, w.u.stream, []string{w.u.node.group})
	if err != nil || backlog > 0 {
		return nil
	}
	w.raiseTo, w.writersPending = wm, false
	defer func() { w.raiseTo = 0 }()
	return w.process(ctx, redis.Batch{}, nil, nil)
}
