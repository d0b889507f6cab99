package stages

import (
	"context"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

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
	m.changed()
	return append(out, Output{Topic: s.out, Message: *m}), nil
}
