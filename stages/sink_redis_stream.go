package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
)

// The redis_stream sink's attributes.
const (
	streamSinkFieldStream = "stream"
	streamSinkFieldMaxLen = "max_len"
)

// The redis_stream sink appends each message to a stream that other applications read, in the same
// round trip that acknowledges the batch (a Write).
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "redis_stream",
			Doc:  "Appends each message to a Redis stream that other applications read.",
			Attributes: []flow.Attribute{
				{Name: streamSinkFieldStream, Type: flow.TypeString, Required: true, Doc: "The stream's key, used as it is (the pipeline's key_prefix does not apply)."},
				{Name: streamSinkFieldMaxLen, Type: flow.TypeInteger, Min: flow.Bound(1), Doc: "Caps the stream at about this many entries (XADD MAXLEN ~)."},
			},
			Example: `sink "to_billing" {
  kind   = "redis_stream"
  input  = topic.invoices
  stream = "billing:invoices"
}`,
		},
		Traits: SinkTraits{Inline: true},
		New: func(s *flow.Sink, _ Env) (Sink, error) {
			return &streamSink{stream: s.Config.String(streamSinkFieldStream), maxLen: s.Config.Int(streamSinkFieldMaxLen)}, nil
		},
		Streams: func(s *flow.Sink) []string { return []string{s.Config.String(streamSinkFieldStream)} },
	})
}

type streamSink struct {
	stream string
	maxLen int64
}

func (s *streamSink) Deliver(_ context.Context, m *Message, out []Write) ([]Write, error) {
	return append(out, Write{Stream: s.stream, MaxLen: s.maxLen, Message: m}), nil
}
