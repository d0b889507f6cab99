package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
)

// The stdin source reads JSON lines from standard input (see jsonlines.go) and ends at the end of
// the input. Every process runs its own: each reads its own standard input, which cannot be read
// again after a restart.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "stdin",
			Doc:  "Reads JSON lines from standard input, one message per line, and ends at the end of the input.",
			Example: `source "lines" {
  kind   = "stdin"
  output = topic.events
}`,
		},
		Traits: SourceTraits{Shared: true},
		New: func(_ *flow.Source, env Env) (Source, error) {
			return &stdinSource{env: env}, nil
		},
	})
}

type stdinSource struct{ env Env }

func (s *stdinSource) Produce(ctx context.Context, out Emitter) error {
	lr := lineReader{name: "stdin", maxSize: s.env.MaxMessageSize, run: NewRunID()}
	return readJSONLines(ctx, s.env.Stdin, lr, out)
}
