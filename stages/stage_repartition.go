package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
)

// The repartition stage is the one the compiler inserts before a stateful stage whose input is not
// keyed by its state's key (flow.RepartitionKind): it copies each message into the repartition
// topic, whose key expression re-keys it. Like any stage before a stateful one, it passes its
// input's watermark on to the partitions it writes (flow/watermarks.go).
//
// No pipeline names this kind: it is registered with the runtime only, not with the language.
func init() {
	kinds.Lock()
	defer kinds.Unlock()
	kinds.stages[flow.RepartitionKind] = StageKind{
		Spec:   &flow.Kind{Name: flow.RepartitionKind, Doc: "Copies messages into a repartition topic."},
		Traits: StageTraits{Inline: true},
		New: func(s *flow.Stage, _ Env) (Processor, error) {
			return repartitionStage{out: s.Output}, nil
		},
	}
}

type repartitionStage struct{ out *flow.Topic }

func (s repartitionStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	return append(out, Output{Topic: s.out, Message: *m}), nil
}
