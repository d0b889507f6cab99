package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// routeStage sends a message, unchanged, to the output of its first matching case, or to its
// default; without a default an unmatched message is dropped.
type routeStage struct {
	cases    []routeCase
	fallback *flow.Topic
}

type routeCase struct {
	when *expr.Program
	out  *flow.Topic
}

func (s *routeStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	env := expr.Env{Msg: m.Value}
	for _, c := range s.cases {
		ok, err := c.when.EvalBool(&env)
		if err != nil {
			return out, evalError(err)
		}
		if ok {
			return append(out, Output{Topic: c.out, Message: *m}), nil
		}
	}
	if s.fallback != nil {
		return append(out, Output{Topic: s.fallback, Message: *m}), nil
	}
	return out, nil
}
