package runtime

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/state"
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

// timerWritesPerPage bounds the state writes that the timers of one batch make, per timer of
// maxTimerRounds pages: a timer that many members share (a dedupe's keys of one time) writes for
// each, and the batch stops firing once its timers have written maxTimerRounds pages of this many
// each (a timer of one window or key writes a few).
const timerWritesPerPage = 8

// fireTimers calls the processor's OnTimer for the timers due at the batch's watermark wm (Unix
// ms) and returns the outputs they made, of which deadLetters went to the stage's dead letters (an
// Output with DeadLetter: a message that waited in the state, such as a lookup's with as_of, and
// failed for good when its timer fired; the message was absorbed when it came, so its dead letter
// is no outcome of it, see outcomes.go). A batch fires at most maxTimerRounds pages of a batch's
// size, and stops once they have written timerWritesPerPage state changes per timer of those pages,
// so that one commit stays bounded however many windows close at once; left is then the time of
// the earliest timer still due (0: none), which the next turn fires (see endTime).
func (w *worker) fireTimers(ctx context.Context, th stages.TimerHandler, st *state.Batch, wm int64) (outs []redis.Output, deadLetters int, left int64, err error) {
	n := w.u.node
	if wm <= 0 {
		return nil, 0, 0, nil
	}
	fired := map[string]bool{}
	budget := st.Changes() + maxTimerRounds*timerWritesPerPage*w.r.opts.BatchSize
	for round := 0; ; round++ {
		due, err := st.DueTimers(ctx, wm, int64(w.r.opts.BatchSize), fired)
		if err != nil || len(due) == 0 {
			return outs, deadLetters, 0, err
		}
		if round == maxTimerRounds {
			return outs, deadLetters, due[0].At, nil
		}
		if p, ok := th.(stages.TimerStatePrefetcher); ok {
			var keys []string
			for _, t := range due {
				keys = p.TimerStateKeys(t.Name, keys)
			}
			st.Prefetch(ctx, keys)
		}
		for _, t := range due {
			if st.Changes() > budget {
				return outs, deadLetters, t.At, nil
			}
			fired[t.Name] = true
			a := st.Attempt(wm)
			if err := a.CancelTimer(ctx, t.Name); err != nil {
				return nil, 0, 0, err
			}
			results, err := th.OnTimer(ctx, a, t.Name, time.UnixMilli(t.At), nil)
			switch {
			case err != nil && stages.IsPermanent(err):
				n.log.Error("a timer failed for good; it is dropped", "timer", t.Name, "err", err)
				drop := st.Attempt(wm)
				_ = drop.CancelTimer(ctx, t.Name)
				drop.Join()
				continue
			case err != nil:
				return nil, 0, 0, fmt.Errorf("timer %s: %w", t.Name, err)
			}
			a.Join()
			named := outputsNamedBy(t)
			for i := range results {
				o := &results[i]
				origin, err := timerOrigin(named, &o.Message, w.u.partition)
				if err == nil && o.DeadLetter != "" {
					origin.msg = o.Message
					outs = append(outs, w.r.deadLetterMessage(n, origin, errors.New(o.DeadLetter), 1, w.r.clock.Now()))
					deadLetters++
					continue
				}
				var out redis.Output
				if err == nil {
					out, err = w.r.topicOutput(n, origin, o.Topic, &o.Message, i, w.u.partition)
				}
				var invalid *flow.SchemaError
				if errors.As(err, &invalid) {
					// A result that its topic's schema refuses is kept, as a dead letter.
					origin.msg = o.Message
					outs = append(outs, w.r.deadLetterMessage(n, origin, err, 1, w.r.clock.Now()))
					deadLetters++
					continue
				}
				if err != nil {
					n.log.Error("a timer's output cannot be written; it is dropped", "timer", t.Name, "err", err)
					continue
				}
				outs = append(outs, out)
			}
		}
	}
}

// timerOrigin names an output of a timer for effectively-once delivery by the timer, its time
// (named, outputsNamedBy) and the output's content: a batch processed again after a crash makes the
// same outputs, which are then written once, while a timer that fires again at the same time with
// something new to say (an on_update emit after a later batch) is not taken for a repeat. The
// payload is encoded once, here.
func timerOrigin(named string, m *stages.Message, partition int) (*message, error) {
	payload, err := m.Payload()
	if err != nil {
		return nil, err
	}
	*m = stages.NewMessage(m.Key, payload, m.Headers)
	h := fnv.New64a()
	h.Write([]byte(m.Key))
	h.Write([]byte{0})
	h.Write(payload)
	return &message{id: fmt.Sprintf("timer-%s-%x", named, h.Sum64()), partition: partition}, nil
}

// outputsNamedBy is what names the outputs of a firing of timer t: its name and time. A timer
// that members share (stages.TimerGroupName, such as the windows of an aggregate that close
// together) is named by all of them, too long to name each of its outputs: its name's hash stands
// for it.
func outputsNamedBy(t redis.DueTimer) string {
	name := t.Name
	if strings.HasPrefix(name, "\x00") {
		h := fnv.New64a()
		h.Write([]byte(name))
		name = fmt.Sprintf("group-%x", h.Sum64())
	}
	return name + "-" + strconv.FormatInt(t.At, 10)
}
