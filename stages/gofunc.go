package stages

import (
	"context"
	"fmt"

	"github.com/flowrun/flowrun/flow"
)

// goStage calls a registered Go function.
type goStage struct {
	out *flow.Topic
	fn  Func
}

func (s *goStage) Process(ctx context.Context, m *Message, out []Output) (outs []Output, err error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	defer func() {
		// A panicking function fails this message instead of the process; retrying would panic again.
		if r := recover(); r != nil {
			outs, err = out, Permanent(fmt.Errorf("the Go stage function panicked: %v", r))
		}
	}()
	results, err := s.fn(ctx, *m)
	if err != nil {
		return out, err
	}
	for _, r := range results {
		r.changed() // the function may have changed anything
		out = append(out, Output{Topic: s.out, Message: r})
	}
	return out, nil
}
