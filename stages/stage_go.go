package stages

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The go stage's attributes.
const (
	goFieldFunc = "func"
)

// The go stage runs a Go function registered with Register, or with RegisterStateful: a stage that
// calls a stateful function is itself stateful (its traits depend on its func).
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name: "go",
			// A stateful function's state is the function's own.
			StateShape: []string{goFieldFunc},
			Doc: "Runs a Go function compiled into the flowrun binary with stages.Register; it may emit " +
				"zero, one or several messages per input, with keys of its own. A function registered with " +
				"stages.KeepsKey passes every message on with the key it got, so that the stage reading it as " +
				"stage.NAME may run fused with it, in one hop. A function registered with stages.RegisterStateful " +
				"keeps state per key and sets timers in event time, in its input partition, committed with " +
				"the acknowledgements: its stage is stateful, like a dedupe or aggregate stage.",
			Attributes: []flow.Attribute{
				{Name: goFieldFunc, Type: flow.TypeString, Required: true, Doc: "The registered name of the function, such as \"acme.score\"."},
				{
					Name: flow.EventTimeAttribute, Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the time the message's entry was written",
					Doc: "For a stateful function only: the message's event time, an RFC 3339 string or Unix milliseconds. " +
						"The partition's watermark, the latest event time it has seen, makes the function's timers due.",
				},
			},
			Example: `stage "score" {
  kind   = "go"
  func   = "acme.score"
  input  = stage.enrich
  output = topic.scored
}`,
			Check:  checkGoFunc,
			Detail: func(config flow.Attrs) string { return "go stage: " + config.String(goFieldFunc) },
		},
		TraitsOf: func(config flow.Attrs) StageTraits {
			name := config.String(goFieldFunc)
			if _, stateful := LookupStateful(name); stateful {
				return StageTraits{Stateful: true}
			}
			return StageTraits{KeepsKey: FuncKeepsKey(name)}
		},
		New:         newGoStage,
		NewStateful: newStatefulGoStage,
	})
}

// checkGoFunc reports a go stage whose function is not registered in this binary, and an event_time
// for a function that keeps no state.
func checkGoFunc(c *flow.KindCheck) {
	name := c.Config.String(goFieldFunc)
	if _, plain := Lookup(name); plain && c.Has(flow.EventTimeAttribute) {
		c.Errorf(flow.EventTimeAttribute, "Event time of a stateless function",
			"%q keeps no state, so it has no use for event time: event_time is for functions registered with stages.RegisterStateful.", name)
	}
	if !c.Has(goFieldFunc) || name == "" || slices.Contains(c.GoFuncs, name) {
		return
	}
	detail := fmt.Sprintf("No Go stage function %q is registered in this flowrun binary.%s", name, flow.DidYouMean(name, c.GoFuncs))
	if len(c.GoFuncs) > 0 {
		detail += fmt.Sprintf(" Registered: %s.", flow.QuotedList(c.GoFuncs))
	}
	detail += " Functions are registered with stages.Register and compiled into a custom binary (see examples/plugins)."
	c.Errorf(goFieldFunc, "Unknown Go stage function", "%s", detail)
}

// newGoStage finds the stage's function: env.Functions first, so that a test's mock stands in for a
// function (a mock keeps no state), then the registered ones.
func newGoStage(s *flow.Stage, env Env) (Processor, error) {
	name := s.Config.String(goFieldFunc)
	lookup := env.Functions
	if lookup == nil {
		lookup = Lookup
	}
	if fn, ok := lookup(name); ok {
		return &goStage{out: s.Output, fn: fn}, nil
	}
	return nil, fmt.Errorf("stage %s: no Go stage function %q is registered in this binary", s.Name, name)
}

// newStatefulGoStage finds the stage's stateful function (RegisterStateful); a test's mock of it
// (env.Functions) stands in for it, keeping no state and setting no timers. The stage has timers
// when the function has OnTimer, and fires them at a job's end when it asks for it (FireAtEnd).
func newStatefulGoStage(s *flow.Stage, env Env) (StatefulStage, error) {
	name := s.Config.String(goFieldFunc)
	if env.Functions != nil {
		if fn, ok := env.Functions(name); ok {
			return StatefulStage{Processor: mockedStatefulStage{&goStage{out: s.Output, fn: fn}}}, nil
		}
	}
	fn, ok := LookupStateful(name)
	if !ok {
		return StatefulStage{}, fmt.Errorf("stage %s: no stateful Go stage function %q is registered in this binary", s.Name, name)
	}
	st := &statefulGoStage{out: s.Output, fn: fn, eventTime: flow.EventTimeOf(s)}
	if fn.OnTimer == nil {
		return StatefulStage{Processor: st}, nil
	}
	return StatefulStage{Processor: st, TimerHandler: st, FireAtEnd: fn.FireAtEnd}, nil
}

// goStage calls a registered Go function.
type goStage struct {
	out *flow.Topic
	fn  Func
}

func (s *goStage) Process(ctx context.Context, m *Message, out []Output) ([]Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	return call(s.out, out, func() ([]Message, error) { return s.fn(ctx, *m) })
}

// statefulGoStage calls a function registered with RegisterStateful, once the message's event time
// is known: a message that has none cannot be placed in time, and is dead-lettered.
type statefulGoStage struct {
	out       *flow.Topic
	fn        StatefulFunc
	eventTime *expr.Program // nil: the entry's time
}

func (s *statefulGoStage) Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	if _, err := EventTime(s.eventTime, m); err != nil {
		return out, err
	}
	state := funcState{State: st, timers: s.fn.OnTimer != nil}
	return call(s.out, out, func() ([]Message, error) { return s.fn.Process(ctx, *m, state) })
}

// mockedStatefulStage is a test's mock of a stateful function: a plain function in its place.
type mockedStatefulStage struct{ *goStage }

func (s mockedStatefulStage) Process(ctx context.Context, _ State, m *Message, out []Output) ([]Output, error) {
	return s.goStage.Process(ctx, m, out)
}

// OnTimer calls the function's OnTimer: the stage declares it (TimerHandler) only when it has one.
func (s *statefulGoStage) OnTimer(ctx context.Context, st State, name string, at time.Time, out []Output) ([]Output, error) {
	state := funcState{State: st, timers: true}
	return call(s.out, out, func() ([]Message, error) { return s.fn.OnTimer(ctx, name, at, state) })
}

// call runs a function and appends what it returned to out, as outputs to topic.
func call(topic *flow.Topic, out []Output, fn func() ([]Message, error)) (outs []Output, err error) {
	defer func() {
		// A panicking function fails this message instead of the process; retrying would panic again.
		if r := recover(); r != nil {
			outs, err = out, Permanent(fmt.Errorf("the Go stage function panicked: %v", r))
		}
	}()
	results, err := fn()
	if err != nil {
		return out, err
	}
	for _, r := range results {
		r.Changed() // the function may have changed anything
		out = append(out, Output{Topic: topic, Message: r})
	}
	return out, nil
}

// funcState is the State a stateful function gets: the runtime's, refusing timers to a function
// that has no OnTimer to fire them.
type funcState struct {
	State
	timers bool
}

var errNoOnTimer = errors.New("the stateful function set a timer, but it has no OnTimer to fire it")

func (s funcState) SetTimer(ctx context.Context, name string, at time.Time) error {
	if !s.timers {
		return Permanent(errNoOnTimer)
	}
	return s.State.SetTimer(ctx, name, at)
}
