package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
)

// The stdout sink prints each message's payload as a line of JSON on the process's standard output,
// which every stdout sink of the process shares (Env.Stdout).
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "stdout",
			Doc:  "Prints each message as a line of JSON on standard output.",
			Example: `sink "console" {
  kind  = "stdout"
  input = topic.alerts
}`,
		},
		Traits: SinkTraits{Inline: true},
		New: func(_ *flow.Sink, env Env) (Sink, error) {
			return &stdoutSink{w: env.Stdout}, nil
		},
	})
}

type stdoutSink struct{ w *LineWriter }

func (s *stdoutSink) Deliver(_ context.Context, m *Message, out []Write) ([]Write, error) {
	payload, err := m.Payload()
	if err != nil {
		return out, err
	}
	return out, s.w.WriteLine(payload)
}

func (s *stdoutSink) Flush(context.Context) error { return s.w.Flush() }
