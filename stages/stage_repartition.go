package stages

import (
	"context"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The repartition stage is the one the compiler inserts before a stateful stage whose input is not
// keyed by its state's key (flow.RepartitionKind): it copies each message into the repartition
// topic, whose key expression re-keys it. It keeps a watermark of its own, the latest event time
// its input partition has seen (in the stateful stage's terms: its event_time), which the
// stateful stage reads to take the minimum over its writers. A message whose event time is its
// entry's time carries that time on (EventTimeHeader), as the copy is a new entry.
//
// No pipeline names this kind: it is registered with the runtime only, not with the language.
func init() {
	kinds.Lock()
	defer kinds.Unlock()
	kinds.stages[flow.RepartitionKind] = StageKind{
		Spec:   &flow.Kind{Name: flow.RepartitionKind, Doc: "Copies messages into a repartition topic."},
		Traits: StageTraits{Stateful: true, Inline: true},
		New: func(s *flow.Stage, env Env) (Processor, error) {
			r := &repartitionStage{out: s.Output, state: env.State, idleTimeout: flow.RepartitionIdleTimeout}
			if s.Config.Declares("event_time") {
				r.eventTime = s.Config.Expr("event_time")
			}
			if s.Config.Declares("idle_timeout") {
				r.idleTimeout = s.Config.Duration("idle_timeout")
			}
			return r, nil
		},
	}
}

// EventTimeHeader carries the event time, in Unix milliseconds, of a message that a repartition
// stage copied and whose event time is its entry's time: EventTime reads it in place of the copy's.
const EventTimeHeader = "flowrun-event-time"

type repartitionStage struct {
	out         *flow.Topic
	eventTime   *expr.Program // nil: the entry's time
	idleTimeout time.Duration
	state       State
}

func (s *repartitionStage) Process(ctx context.Context, m *Message, out []Output) ([]Output, error) {
	at, err := EventTime(s.eventTime, m)
	if err != nil {
		return out, err
	}
	if err := s.state.Observe(ctx, at); err != nil {
		return out, err
	}
	if s.eventTime == nil && m.Headers[EventTimeHeader] == "" {
		headers := make(map[string]string, len(m.Headers)+1)
		for k, v := range m.Headers {
			headers[k] = v
		}
		headers[EventTimeHeader] = strconv.FormatInt(at.UnixMilli(), 10)
		m.Headers = headers
	}
	return append(out, Output{Topic: s.out, Message: *m}), nil
}

// OnTimer is never called with a timer (the stage sets none); implementing it lets an idle
// partition's watermark move (IdleAdvancer), which the runtime moves as it fires timers.
func (s *repartitionStage) OnTimer(_ context.Context, _ string, _ time.Time, out []Output) ([]Output, error) {
	return out, nil
}

// IdleTimeout makes the watermark of an idle, caught-up input partition move with the clock, so
// that the stateful stage's windows close (IdleAdvancer).
func (s *repartitionStage) IdleTimeout() time.Duration { return s.idleTimeout }
