package stages

import (
	"context"
	"maps"
	"strconv"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The repartition stage is the one the compiler inserts before a stateful stage whose input is not
// keyed by its state's key (flow.RepartitionKind): it copies each message into the repartition
// topic, whose key expression re-keys it. Like any stage before a stateful one, it passes its
// input's watermark on to the partitions it writes (flow/watermarks.go).
//
// Before a stage with two inputs (a join), one repartition stage per side (flow/sides.go) writes
// the one repartition topic: it keys each message by the side's key and tags it with its side
// (SideHeader), its event time by the side's event_time (EventTimeHeader, which the join reads as
// its own), and the watermark it carries from where it entered the pipeline, in that time.
//
// No pipeline names this kind: it is registered with the runtime only, not with the language.
func init() {
	kinds.Lock()
	defer kinds.Unlock()
	kinds.stages[flow.RepartitionKind] = StageKind{
		Spec:   &flow.Kind{Name: flow.RepartitionKind, Doc: "Copies messages into a repartition topic."},
		Traits: StageTraits{Inline: true},
		New: func(s *flow.Stage, _ Env) (Processor, error) {
			if s.Side != "" {
				return newSideStage(s), nil
			}
			return repartitionStage{out: s.Output}, nil
		},
	}
}

type repartitionStage struct{ out *flow.Topic }

func (s repartitionStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	return append(out, Output{Topic: s.out, Message: *m}), nil
}

// sideStage writes one side of a stage with two inputs into its repartition topic.
type sideStage struct {
	out       *flow.Topic
	side      string
	key       *expr.Program
	eventTime *expr.Program // nil: the entry's time
	// carried is the header of the watermark, in the side's event time, that a message carries
	// from where it entered the pipeline (WatermarkHeader); "" when that time is the entry's.
	carried string
}

func newSideStage(s *flow.Stage) sideStage {
	st := sideStage{out: s.Output, side: s.Side, key: s.Config.Expr(flow.SideKeyAttribute), eventTime: flow.EventTimeOf(s)}
	if w := s.Watermark; w != nil && w.Own >= 0 && w.Domains[w.Own].Name != "" {
		st.carried = WatermarkHeaderOf(w.Domains[w.Own].Name)
	}
	return st
}

func (s sideStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	key, err := s.key.EvalString(&expr.Env{Msg: m.Value})
	if err != nil {
		return out, evalError(err)
	}
	if err := checkStateKey(key); err != nil {
		return out, err
	}
	at, err := EventTime(s.eventTime, m)
	if err != nil {
		return out, err
	}
	headers := make(map[string]string, len(m.Headers)+3)
	maps.Copy(headers, m.Headers)
	headers[SideHeader] = s.side
	headers[EventTimeHeader] = strconv.FormatInt(at.UnixMilli(), 10)
	delete(headers, WatermarkHeader)
	if s.carried != "" && m.Headers[s.carried] != "" {
		headers[WatermarkHeader] = m.Headers[s.carried]
	}
	tagged := *m
	tagged.Key, tagged.Headers = key, headers
	return append(out, Output{Topic: s.out, Message: tagged}), nil
}
