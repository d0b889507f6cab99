package runtime

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Timers of stateful stages are due in event time: once the partition's watermark reaches them. A
// batch that moved the watermark fires what became due, after its messages, in the same view of the
// state: what OnTimer writes and outputs is committed with the batch's acks, so a window's result
// and the deletion of its state happen in one step, or not at all.

// maxTimerRounds bounds the rounds of firing in one batch: a round may set timers that are due at
// once (a window that opens the next), and those fire in the next round.
const maxTimerRounds = 16

// fireTimers calls the processor's OnTimer for every timer due at the batch's watermark and returns
// the outputs they made.
func (w *worker) fireTimers(ctx context.Context, th stages.TimerHandler, state *batchState) ([]redis.Output, error) {
	n := w.u.node
	wm, err := state.loadWatermark(ctx)
	if err == nil && w.raiseTo > wm {
		// The writers of a repartition topic have all passed raiseTo (watermark_writers.go).
		state.mu.Lock()
		wm = w.raiseTo
		state.watermark, state.moved = wm, true
		state.mu.Unlock()
	}
	if err == nil && w.idleAdvance > 0 && wm == 0 && !w.markedIdle {
		// Idle before it saw anything: say so, for the readers of a repartition topic it writes.
		state.mu.Lock()
		state.set = put(state.set, redis.IdleField, []byte("1"))
		state.mu.Unlock()
		w.markedIdle = true
	}
	if err == nil && w.idleAdvance > 0 && wm > 0 {
		// An idle partition's watermark moves with the clock (worker.idle), and stays moved.
		state.mu.Lock()
		wm += w.idleAdvance.Milliseconds()
		state.watermark, state.moved = wm, true
		state.mu.Unlock()
	}
	switch {
	case err != nil:
		return nil, err
	case w.closingAll:
		wm = math.MaxInt64
	case wm == 0:
		return nil, nil
	}
	var outs []redis.Output
	fired := map[string]bool{}
	for round := 0; round < maxTimerRounds; round++ {
		due, err := w.dueTimers(ctx, state, wm, fired)
		if err != nil || len(due) == 0 {
			return outs, err
		}
		for _, t := range due {
			fired[t.Name] = true
			results, _, err := withAttemptState(ctx, state, func(ctx context.Context) ([]stages.Output, error) {
				if err := (stateHandle{}).CancelTimer(ctx, t.Name); err != nil {
					return nil, err
				}
				return th.OnTimer(ctx, t.Name, time.UnixMilli(t.At), nil)
			})
			switch {
			case err != nil && stages.IsPermanent(err):
				n.log.Error("a timer failed for good; it is dropped", "timer", t.Name, "err", err)
				_, _, _ = withAttemptState(ctx, state, func(ctx context.Context) ([]stages.Output, error) {
					return nil, (stateHandle{}).CancelTimer(ctx, t.Name)
				})
				continue
			case err != nil:
				return nil, fmt.Errorf("timer %s: %w", t.Name, err)
			}
			for i := range results {
				o := &results[i]
				origin, err := timerOrigin(t, &o.Message, w.u.partition)
				var out redis.Output
				if err == nil {
					out, err = w.r.topicOutput(n, origin, o.Topic, &o.Message, i, w.u.partition)
				}
				if err != nil {
					n.log.Error("a timer's output cannot be written; it is dropped", "timer", t.Name, "err", err)
					continue
				}
				outs = append(outs, out)
			}
		}
	}
	return outs, nil
}

// timerOrigin names an output of a timer for effectively-once delivery by the timer, its time and
// the output's content: a batch processed again after a crash makes the same outputs, which are then
// written once, while a timer that fires again at the same time with something new to say (an
// on_update emit after a later batch) is not taken for a repeat. The payload is encoded once, here.
func timerOrigin(t redis.DueTimer, m *stages.Message, partition int) (*message, error) {
	payload, err := m.Payload()
	if err != nil {
		return nil, err
	}
	*m = stages.NewMessage(m.Key, payload, m.Headers)
	h := fnv.New64a()
	h.Write([]byte(m.Key))
	h.Write([]byte{0})
	h.Write(payload)
	return &message{id: fmt.Sprintf("timer-%s-%d-%x", t.Name, t.At, h.Sum64()), partition: partition}, nil
}

// dueTimers returns the timers due at wm, as the batch sees them: those committed, less those the
// batch cancelled, moved later or fired already, with those it set; earliest first.
func (w *worker) dueTimers(ctx context.Context, state *batchState, wm int64, fired map[string]bool) ([]redis.DueTimer, error) {
	committed, err := w.r.rdb.DueTimers(ctx, state.timers, wm, int64(w.r.opts.BatchSize))
	if err != nil {
		if !redis.Unrecoverable(err) {
			err = stages.Transient(err)
		}
		return nil, err
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	var due []redis.DueTimer
	for _, t := range committed {
		if _, moved := state.timerAt[t.Name]; !moved && !state.cancel[t.Name] && !fired[t.Name] {
			due = append(due, t)
		}
	}
	for name, at := range state.timerAt {
		if at <= wm && !fired[name] {
			due = append(due, redis.DueTimer{Name: name, At: at})
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if due[i].At != due[j].At {
			return due[i].At < due[j].At
		}
		return due[i].Name < due[j].Name
	})
	return due, nil
}
