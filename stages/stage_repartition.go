package stages

import (
	"context"
	"strconv"

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

// EventTimeHeader carries the event time, in Unix milliseconds, of a message whose event time is
// the time its entry was first written (a stateful stage without event_time), or that an aggregate
// gave its result: EventTime reads it in place of the time of the entry it arrives in. Sources and
// the stages that read what comes from outside the pipeline set it, where it is needed.
const EventTimeHeader = "flowrun-event-time"

// WatermarkHeader starts the name of the headers that carry, for each time domain (flow.TimeDomain)
// that stages after it read event time by, the watermark of the place the message entered the
// pipeline (its source) as it was when the message was written there, in Unix milliseconds:
// "flowrun-watermark:msg.ts". A stateful stage takes a message for late when it is late by that
// watermark or by its own, so that what is late is what was late where it entered, whatever the
// batches, partitions and processes on the way.
const WatermarkHeader = "flowrun-watermark"

// WatermarkHeaderOf names the header of a domain.
func WatermarkHeaderOf(domain string) string {
	if domain == "" {
		return WatermarkHeader
	}
	return WatermarkHeader + ":" + domain
}

// CarriedWatermark returns the watermark a message carries for a domain (WatermarkHeader), in Unix
// ms; 0 when it carries none.
func CarriedWatermark(m *Message, domain string) int64 {
	v := m.Headers[WatermarkHeaderOf(domain)]
	if v == "" {
		return 0
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0
	}
	return ms
}

type repartitionStage struct{ out *flow.Topic }

func (s repartitionStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	return append(out, Output{Topic: s.out, Message: *m}), nil
}
