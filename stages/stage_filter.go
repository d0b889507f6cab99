package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The filter stage passes on the messages for which where holds and drops the others.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name: "filter",
			Doc:  "Passes on the messages for which where holds and drops the others.",
			Attributes: []flow.Attribute{
				{Name: "where", Type: flow.TypeMessageBool, Required: true, Roots: []string{"msg"}, Doc: "The condition a message must meet to pass."},
			},
			Example: `stage "big_orders" {
  kind   = "filter"
  input  = topic.orders
  output = topic.big_orders
  where  = msg.amount > 100 && msg.country == "DE"
}`,
		},
		Traits: StageTraits{Inline: true},
		New: func(s *flow.Stage, _ Env) (Processor, error) {
			return &filterStage{out: s.Output, where: s.Config.Expr("where")}, nil
		},
	})
}

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
