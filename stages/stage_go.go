package stages

import (
	"context"
	"fmt"
	"slices"

	"github.com/flowrun/flowrun/flow"
)

// The go stage runs a Go function registered with Register.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name: "go",
			Doc: "Runs a Go function compiled into the flowrun binary with stages.Register; it may emit " +
				"zero, one or several messages per input.",
			Attributes: []flow.Attribute{
				{Name: "func", Type: flow.TypeString, Required: true, Doc: "The registered name of the function, such as \"acme.score\"."},
			},
			Example: `stage "score" {
  kind   = "go"
  func   = "acme.score"
  input  = stage.enrich
  output = topic.scored
}`,
			Check:  checkGoFunc,
			Detail: func(config flow.Attrs) string { return "go stage: " + config.String("func") },
		},
		New: func(s *flow.Stage, env Env) (Processor, error) {
			name := s.Config.String("func")
			lookup := env.Functions
			if lookup == nil {
				lookup = Lookup
			}
			fn, ok := lookup(name)
			if !ok {
				return nil, fmt.Errorf("stage %s: no Go stage function %q is registered in this binary", s.Name, name)
			}
			return &goStage{out: s.Output, fn: fn}, nil
		},
	})
}

// checkGoFunc reports a go stage whose function is not registered in this binary.
func checkGoFunc(c *flow.KindCheck) {
	name := c.Config.String("func")
	if !c.Has("func") || name == "" || slices.Contains(c.GoFuncs, name) {
		return
	}
	detail := fmt.Sprintf("No Go stage function %q is registered in this flowrun binary.%s", name, flow.DidYouMean(name, c.GoFuncs))
	if len(c.GoFuncs) > 0 {
		detail += fmt.Sprintf(" Registered: %s.", flow.QuotedList(c.GoFuncs))
	}
	detail += " Functions are registered with stages.Register and compiled into a custom binary (see examples/plugins)."
	c.Errorf("func", "Unknown Go stage function", "%s", detail)
}

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
		r.Changed() // the function may have changed anything
		out = append(out, Output{Topic: s.out, Message: r})
	}
	return out, nil
}
