package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The filter stage's attributes.
const (
	filterFieldWhere = "where"
)

// The filter stage passes on the messages for which where holds and drops the others.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name: "filter",
			Doc:  "Passes on the messages for which where holds and drops the others.",
			Attributes: []flow.Attribute{
				{Name: filterFieldWhere, Type: flow.TypeMessageBool, Required: true, Roots: []string{"msg"}, Doc: "The condition a message must meet to pass."},
			},
			Example: `stage "big_orders" {
  kind   = "filter"
  input  = topic.orders
  output = topic.big_orders
  where  = msg.amount > 100 && msg.country == "DE"
}`,
			// It passes on the messages it reads, unchanged.
			PassesOn: func(in *expr.Shape, _ flow.Attrs) *expr.Shape { return in },
		},
		Traits: StageTraits{Inline: true, KeepsKey: true, Conditional: true},
		New: func(s *flow.Stage, _ Env) (Processor, error) {
			return &filterStage{out: s.Output, where: s.Config.Expr(filterFieldWhere)}, nil
		},
	})
}

// filterStage passes on the messages for which where holds, unchanged.
type filterStage struct {
	out   *flow.Topic
	where *expr.Program
}

func (s *filterStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	ok, err := Holds(s.where, m)
	if err != nil || !ok {
		return out, err
	}
	return append(out, Output{Topic: s.out, Message: *m}), nil
}

// Holds evaluates a where condition on a message, decoding the fields it reads first: the filter stage's where and
// a sink's. An expression that cannot evaluate on the message fails it for good (Permanent), as it
// would on every attempt; so does a payload that is not a JSON object.
func Holds(where *expr.Program, m *Message) (bool, error) {
	fields, lent, err := m.BorrowFields(where.Fields())
	if err != nil {
		return false, err
	}
	ok, err := where.EvalBool(&expr.Env{Msg: fields})
	ReturnFields(lent)
	if err != nil {
		return false, evalError(err)
	}
	return ok, nil
}
