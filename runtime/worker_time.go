package runtime

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A unit that feeds a stateful stage, or is one, keeps its input partition's watermarks and passes
// them on with its commits (package runtime/state has the how, flow/watermarks.go the rule). This
// file wires it into the worker: the steps of a batch that touch the watermarks, and the turns of
// an idle unit. The Spec of a unit, made from the plan, is marks.go.

// stampsEntryTime reports whether a node that measures its input passes on messages whose event
// time is their entry's time (a later stateful stage has no event_time): the entry's time goes with
// them in a header (stages.EventTimeHeader), for the entry that carries them next has another.
func stampsEntryTime(spec *state.Spec) bool {
	if spec == nil || !spec.Measures {
		return false
	}
	for _, o := range spec.Outputs {
		if o.Results {
			continue
		}
		for _, name := range o.Names {
			if name == "" {
				return true
			}
		}
	}
	return false
}

// stampEntryTime puts the time of a message's entry in its headers, unless it carries one.
func stampEntryTime(m *stages.Message, id string) {
	if m.Headers[stages.EventTimeHeader] != "" {
		return
	}
	ms, err := redis.IDMillis(id)
	if err != nil {
		return
	}
	headers := make(map[string]string, len(m.Headers)+1)
	for k, v := range m.Headers {
		headers[k] = v
	}
	headers[stages.EventTimeHeader] = strconv.FormatInt(ms, 10)
	m.Headers = headers
}

// beginTime starts the watermarks' part of a batch of messages, once they have begun (Begin, in
// process): a followed input's writers are read, a measured one's event times observed. It returns each message's watermark for a stateful
// stage to judge it by.
func (w *worker) beginTime(ctx context.Context, msgs []*message, read bool) ([]int64, error) {
	wm := w.time
	if wm == nil {
		return nil, nil
	}
	if w.u.node.stateful {
		if err := wm.Load(ctx, w.r.rdb, w.stateKeys.Hash); err != nil {
			return nil, err
		}
	}
	if err := wm.Resume(ctx, w.r.rdb, w.stateKeys.Hash); err != nil {
		return nil, err
	}
	if !wm.Measures() {
		if read {
			if err := wm.Follow(ctx, w.r.rdb); err != nil {
				w.u.node.log.Debug("cannot read the watermarks of the input's writers", "err", err)
			}
		}
		if !w.u.node.stateful {
			return nil, nil
		}
		own := make([]int64, len(msgs))
		for i := range own {
			own[i] = wm.Committed()
		}
		return w.carried(msgs, own), nil
	}
	sm := make([]*stages.Message, len(msgs))
	for i, m := range msgs {
		sm[i] = &m.msg
	}
	return w.carried(msgs, wm.Observe(sm)), nil
}

// carried raises each message's watermark to the one it carries from where it entered the
// pipeline (stages.WatermarkHeader): a stateful stage judges a message late by the later of the
// two, so that what is late does not depend on batches and processes on the way.
func (w *worker) carried(msgs []*message, own []int64) []int64 {
	if own == nil {
		return nil
	}
	domain := w.u.node.stage.Watermark.Domains[w.u.node.stage.Watermark.Own].Name
	for i, m := range msgs {
		own[i] = max(own[i], stages.CarriedWatermark(&m.msg, domain))
	}
	return own
}

// endTime ends the watermarks' part of a batch, once its timers have fired: a stateful stage's own
// watermark is written with its state when it moved, and the marks of what the unit writes go with
// the commit. timersLeft is the time of the earliest timer that is due but did not fire in this
// batch (0: none): what it will write is not written yet, so the watermark of the unit's results
// stays where that timer's result can be, and the unit does not close.
func (w *worker) endTime(ctx context.Context, st *state.Batch, timersLeft int64) ([]redis.MarkWrite, error) {
	wm := w.time
	if wm == nil {
		return nil, nil
	}
	n := w.u.node
	if st != nil && wm.Own() > wm.Committed() {
		st.SetWatermark(wm.Own())
	}
	if timersLeft > 0 {
		wm.KeepOpen()
	}
	if n.stage != nil && n.stage.Watermark != nil && n.stage.Watermark.Delayed >= 0 {
		// A waiting message (its timer is at its time + 1 ms) is passed on later with its time.
		wm.HoldPassedOn(n.stage.Watermark.Delayed, max(timersLeft-1, 0))
	}
	var holdErr error
	marks := wm.Marks(func() int64 {
		own := wm.Own()
		if own <= 0 || n.outputWatermark == nil {
			return own
		}
		at := n.outputWatermark.OutputWatermark(time.UnixMilli(own)).UnixMilli()
		if timersLeft > 0 {
			at = min(at, n.outputWatermark.OutputWatermark(time.UnixMilli(timersLeft)).UnixMilli())
		}
		if st != nil {
			held, found, err := st.MinHold(ctx)
			if err != nil {
				holdErr = err
				return 0
			}
			if found {
				at = min(at, held)
			}
		}
		return at
	})
	return marks, holdErr
}

// timerWatermark is what the timers of a batch fire at: the unit's own watermark, or every timer
// when its input closed at a job's end (for kinds whose timers fire then).
func (w *worker) timerWatermark() int64 {
	if w.time.Closing() && w.u.node.fireAtEnd {
		return math.MaxInt64
	}
	return w.time.Own()
}

// idleTurn is a turn of a timed unit whose read found nothing: its watermarks may move (its writers
// moved theirs, it has been idle long enough, a job's input closed), and then the unit commits a
// batch without messages, firing the timers that became due and passing the watermarks on.
func (w *worker) idleTurn(ctx context.Context) error {
	if w.time == nil || w.recover {
		return nil
	}
	n := w.u.node
	if err := w.time.Resume(ctx, w.r.rdb, w.stateKeys.Hash); err != nil {
		n.log.Debug("cannot read the watermarks the unit measured last", "err", err)
		return nil
	}
	w.time.Begin()
	changed, err := w.time.Idle(ctx, w.r.rdb, w.r.clock.Now(), w.r.closing.Load(), func() (bool, error) {
		if w.u.retryKey != "" {
			if _, waiting, err := w.r.rdb.NextRetry(ctx, w.u.retryKey); err != nil || waiting {
				return false, err // messages waiting for a retry hold the watermark back
			}
		}
		backlog, err := w.r.rdb.Backlog(ctx, w.u.stream, []string{n.group})
		return backlog == 0, err
	})
	if err != nil {
		n.log.Debug("cannot tell whether the watermarks move", "err", err)
		return nil
	}
	if !changed && !w.timersDue && !w.tableWaits {
		return nil
	}
	w.r.activity.add(1)
	return w.processBegun(ctx, redis.Batch{}, nil, nil)
}

// timeCommitted tells the watermarks that the batch is committed, and the drain of a job that the
// unit's input closed.
func (w *worker) timeCommitted() {
	if w.time == nil {
		return
	}
	wasClosed := w.time.Closed()
	w.time.Commit()
	w.timeClosed(wasClosed)
}

// timeClosed drains a job whose unit's input a commit closed: wasClosed says whether it was
// closed before.
func (w *worker) timeClosed(wasClosed bool) {
	if w.time.Closed() && !wasClosed {
		w.r.kickDrain()
		_ = w.r.rdb.UnblockReads(context.Background()) // the units after it may close now
	}
}

// measured is what a unit that measures its input's watermark keeps of it with the batch's commit
// (state.Watermarks.Measured); nil when nothing moved.
func (w *worker) measured() []byte {
	if w.time == nil || w.stateKeys.Hash == "" {
		return nil
	}
	return w.time.Measured()
}
