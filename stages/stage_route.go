package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The route stage's attributes and blocks, and the attributes of a case.
const (
	routeFieldDefault = "default"
	routeBlockCase    = "case"
	caseFieldWhen     = "when"
	caseFieldOutput   = "output"
)

// The route stage sends each message to the output of the first case whose condition holds.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name:       "route",
			Doc:        "Sends each message to the output of the first case whose condition holds, or to default.",
			OutputsDoc: "the outputs of its case blocks and its default",
			Attributes: []flow.Attribute{
				{Name: routeFieldDefault, Type: flow.TypeTopicRef, Doc: "The topic for messages that match no case; without it they are dropped and counted."},
			},
			Blocks: []flow.NestedBlock{{Spec: caseSpec, Min: 1}},
			Example: `stage "by_region" {
  kind  = "route"
  input = topic.orders
  case {
    when   = msg.region == "eu"
    output = topic.orders_eu
  }
  case {
    when   = msg.region == "us"
    output = topic.orders_us
  }
  default = topic.orders_other
}`,
			OwnOutputs: routeOutputs,
		},
		Traits: StageTraits{Inline: true, KeepsKey: true, Conditional: true},
		New: func(s *flow.Stage, _ Env) (Processor, error) {
			r := &routeStage{fallback: s.Config.Topic(routeFieldDefault)}
			for _, c := range s.Config.Blocks(routeBlockCase) {
				r.cases = append(r.cases, routeCase{when: c.Expr(caseFieldWhen), out: c.Topic(caseFieldOutput)})
			}
			return r, nil
		},
	})
}

var caseSpec = &flow.BlockSpec{
	Type: routeBlockCase,
	Doc:  "One branch of a route stage: a message goes to the output of the first case whose condition holds.",
	Attributes: []flow.Attribute{
		{Name: caseFieldWhen, Type: flow.TypeMessageBool, Required: true, Roots: []string{"msg"}, Doc: "The condition, such as msg.region == \"eu\"."},
		{Name: caseFieldOutput, Type: flow.TypeTopicRef, Required: true, Doc: "The topic for messages of this case, as topic.NAME."},
	},
}

// routeOutputs lists a route's topics for graphs: its cases, labelled with their conditions, then
// its default.
func routeOutputs(config flow.Attrs) []flow.KindOutput {
	var outs []flow.KindOutput
	for _, c := range config.Blocks(routeBlockCase) {
		if t := c.Topic(caseFieldOutput); t != nil {
			label := ""
			if when := c.Expr(caseFieldWhen); when != nil {
				label = when.String()
			}
			outs = append(outs, flow.KindOutput{Topic: t, Label: label})
		}
	}
	if t := config.Topic(routeFieldDefault); t != nil {
		outs = append(outs, flow.KindOutput{Topic: t, Label: "default"})
	}
	return outs
}

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
