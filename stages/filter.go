package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// filterStage passes on the messages for which where holds, unchanged.
type filterStage struct {
	out   *flow.Topic
	where *expr.Program
}

func (s *filterStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	ok, err := s.where.EvalBool(&expr.Env{Msg: m.Value})
	if err != nil {
		return out, evalError(err)
	}
	if !ok {
		return out, nil
	}
	return append(out, Output{Topic: s.out, Message: *m}), nil
}
