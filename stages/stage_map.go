package stages

import (
	"context"
	"fmt"
	"maps"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The map stage's attributes.
const (
	mapFieldSet  = "set"
	mapFieldDrop = "drop"
)

// The map stage changes each message: set adds or replaces fields, then drop removes fields.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name: "map",
			Doc:  "Changes each message: set adds or replaces fields, then drop removes fields.",
			Attributes: []flow.Attribute{
				{Name: mapFieldSet, Type: flow.TypeMessageFields, Roots: []string{"msg"}, Doc: "Fields to add or replace, as an object of expressions over msg."},
				{Name: mapFieldDrop, Type: flow.TypeStringList, Doc: "Names of fields to remove."},
			},
			Example: `stage "enrich" {
  kind   = "map"
  input  = topic.orders
  output = topic.enriched
  set = {
    total   = msg.amount * (1 + var.vat_rate)
    country = upper(msg.country)
  }
  drop = ["internal_note"]
}`,
			PassesOn: mapPassesOn,
			Check: func(c *flow.KindCheck) {
				if !c.Has(mapFieldSet) && !c.Has(mapFieldDrop) {
					c.Warnf("", "Map stage changes nothing", "Give it set, drop or both; as it is, it passes messages on unchanged.")
				}
			},
		},
		Traits: StageTraits{Inline: true, KeepsKey: true},
		New: func(s *flow.Stage, _ Env) (Processor, error) {
			return &mapStage{out: s.Output, set: s.Config.Fields(mapFieldSet), drop: s.Config.Strings(mapFieldDrop)}, nil
		},
	})
}

// mapPassesOn describes a map's outputs: its input's fields, those that set computes (of the kind
// their expressions are known to have, if any) and without those that drop removes.
func mapPassesOn(in *expr.Shape, config flow.Attrs) *expr.Shape {
	out := *in
	out.Fields = maps.Clone(in.Fields)
	if out.Fields == nil {
		out.Fields = map[string]*expr.Shape{}
	}
	for _, f := range config.Fields(mapFieldSet) {
		s := f.Expr.Shape()
		if s == nil {
			s = &expr.Shape{}
		}
		if s.Origin == "" {
			s = &expr.Shape{Kinds: s.Kinds, Fields: s.Fields, Closed: s.Closed, Items: s.Items,
				Origin: fmt.Sprintf("the map's set (%s = %s)", f.Name, f.Expr)}
		}
		out.Fields[f.Name] = s
	}
	for _, name := range config.Strings(mapFieldDrop) {
		delete(out.Fields, name)
	}
	return &out
}

// mapStage sets fields from expressions, then drops fields.
type mapStage struct {
	out  *flow.Topic
	set  []flow.Field
	drop []string
}

func (s *mapStage) Process(_ context.Context, m *Message, out []Output) ([]Output, error) {
	if len(s.set) == 0 && len(s.drop) == 0 {
		return append(out, Output{Topic: s.out, Message: *m}), nil
	}
	if err := m.Decode(); err != nil {
		return out, err
	}
	if len(s.set) > 0 {
		// Every expression sees the message as it arrived, as in an HCL object: a field set here is
		// not visible to the other fields' expressions.
		env := expr.Env{Msg: m.Value}
		values := make([]any, len(s.set))
		for i, f := range s.set {
			v, err := f.Expr.Eval(&env)
			if err != nil {
				return out, evalError(err)
			}
			values[i] = v.Interface()
		}
		for i, f := range s.set {
			m.Value[f.Name] = values[i]
		}
	}
	for _, name := range s.drop {
		delete(m.Value, name)
	}
	m.Changed()
	return append(out, Output{Topic: s.out, Message: *m}), nil
}
