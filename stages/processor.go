package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// Processor is a compiled stage: it turns one input message into the messages it passes on.
type Processor interface {
	// Process appends the outputs of m to out and returns the extended slice, so that a caller can
	// reuse one slice for a whole batch. It may modify m. An error fails this attempt at m; an error
	// marked Permanent (an expression that cannot evaluate on this message, say) is not retried.
	Process(ctx context.Context, m *Message, out []Output) ([]Output, error)
}

// Output is a message and the topic it goes to.
type Output struct {
	Topic   *flow.Topic
	Message Message
}

// Compile builds the processor of a stage of the plan.
func Compile(s *flow.Stage) (Processor, error) {
	switch s.Kind {
	case "map":
		return &mapStage{out: s.Output, set: s.Config.Fields("set"), drop: s.Config.Strings("drop")}, nil
	case "filter":
		return &filterStage{out: s.Output, where: s.Config.Expr("where")}, nil
	case "route":
		r := &routeStage{fallback: s.Config.Topic("default")}
		for _, c := range s.Config.Blocks("case") {
			r.cases = append(r.cases, routeCase{when: c.Expr("when"), out: c.Topic("output")})
		}
		return r, nil
	case "go":
		name := s.Config.String("func")
		fn, ok := Lookup(name)
		if !ok {
			return nil, fmt.Errorf("stage %s: no Go stage function %q is registered in this binary", s.Name, name)
		}
		return &goStage{out: s.Output, fn: fn}, nil
	}
	return nil, fmt.Errorf("stage %s: unknown kind %q", s.Name, s.Kind)
}

// evalError makes an expression's evaluation error permanent: the same message would fail the
// same way on every attempt.
func evalError(err error) error {
	var ee *expr.EvalError
	if errors.As(err, &ee) {
		return Permanent(err)
	}
	return err
}
