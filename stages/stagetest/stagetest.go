// Package stagetest is for the unit tests of Go stage functions and kinds of your own (registered
// with stages.Register, RegisterStateful, RegisterSource, RegisterStage or RegisterSink): a State
// in memory that processes a stateful function's messages and fires its timers as the runtime
// does, an Env for a kind's constructor, and the compilation of a pipeline's text into the blocks
// that constructors take. It needs no Redis. A test of the whole pipeline, with the real runtime
// on an embedded Redis, is a *.flowtest.hcl file run by flowrun test (docs/testing.md).
package stagetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// State is a stages.State in memory: one partition's, partition 0. Its watermark moves only
// forward, with the event times given to Process and AdvanceTo; what a call that fails wrote is
// dropped, as the runtime drops an attempt that fails.
type State struct {
	values    map[string][]byte
	timers    map[string]time.Time
	holds     map[string]time.Time
	watermark time.Time
	recorded  map[stages.Outcome]int
}

// NewState returns an empty State with no watermark yet.
func NewState() *State {
	return &State{values: map[string][]byte{}, timers: map[string]time.Time{}, holds: map[string]time.Time{},
		recorded: map[stages.Outcome]int{}}
}

var _ stages.State = (*State)(nil)

func (s *State) Get(_ context.Context, key string) ([]byte, bool, error) {
	v, ok := s.values[key]
	return slices.Clone(v), ok, nil
}

func (s *State) Put(_ context.Context, key string, value []byte) error {
	s.values[key] = slices.Clone(value)
	return nil
}

func (s *State) Delete(_ context.Context, key string) error {
	delete(s.values, key)
	return nil
}

func (s *State) SetTimer(_ context.Context, name string, at time.Time) error {
	s.timers[name] = at
	return nil
}

func (s *State) CancelTimer(_ context.Context, name string) error {
	delete(s.timers, name)
	return nil
}

// Watermark is the latest event time given to Process or AdvanceTo; the zero time before any.
func (s *State) Watermark(context.Context) (time.Time, error) { return s.watermark, nil }

func (s *State) Hold(_ context.Context, name string, at time.Time) error {
	s.holds[name] = at
	return nil
}

func (s *State) Release(_ context.Context, name string) error {
	delete(s.holds, name)
	return nil
}

func (s *State) Record(o stages.Outcome) { s.recorded[o]++ }

func (s *State) Partition() int { return 0 }

// Values returns a copy of the state's keys and values.
func (s *State) Values() map[string][]byte {
	out := make(map[string][]byte, len(s.values))
	for k, v := range s.values {
		out[k] = slices.Clone(v)
	}
	return out
}

// Timers returns a copy of the timers that are set, by name.
func (s *State) Timers() map[string]time.Time { return maps.Clone(s.timers) }

// Recorded returns how many times the function recorded the outcome (stages.Late,
// stages.Duplicate).
func (s *State) Recorded(o stages.Outcome) int { return s.recorded[o] }

// Process runs fn on m as the stage does: the watermark moves to the message's event time at (if
// later), fn.Process gets the message, and then the timers that the watermark made due fire,
// earliest first (see AdvanceTo). It returns what Process and the timers returned. When Process
// fails, the state is as it was before the call, and the error is returned as Process returned
// it (stages.IsPermanent tells a permanent one). A function without OnTimer that sets a timer
// fails for good, as in the runtime.
func (s *State) Process(ctx context.Context, fn stages.StatefulFunc, m stages.Message, at time.Time) ([]stages.Message, error) {
	if fn.Process == nil {
		return nil, errors.New("stagetest: the StatefulFunc has no Process")
	}
	if err := m.Decode(); err != nil {
		return nil, err
	}
	if at.After(s.watermark) {
		s.watermark = at
	}
	var out []stages.Message
	err := s.attempt(func() error {
		var err error
		out, err = fn.Process(ctx, m, funcState{s, fn.OnTimer != nil})
		return err
	})
	if err != nil {
		return nil, err
	}
	fired, err := s.fire(ctx, fn, s.watermark)
	return append(out, fired...), err
}

// AdvanceTo moves the watermark to at (if later), as a later message of the partition does, and
// fires the timers due at it, earliest first: each is cancelled unless OnTimer sets it again, and
// one that OnTimer sets at or before the watermark fires in the same call. It returns what OnTimer
// returned. An error of OnTimer stops there and keeps that timer, with the state as it was before
// it, as the runtime keeps it to process the batch again; a permanent error drops the timer.
func (s *State) AdvanceTo(ctx context.Context, fn stages.StatefulFunc, at time.Time) ([]stages.Message, error) {
	if at.After(s.watermark) {
		s.watermark = at
	}
	return s.fire(ctx, fn, s.watermark)
}

// End fires every timer whatever its time, as a job does at its end (flowrun run --until-drained)
// for a function registered with FireAtEnd; it fails for one without.
func (s *State) End(ctx context.Context, fn stages.StatefulFunc) ([]stages.Message, error) {
	if !fn.FireAtEnd {
		return nil, errors.New("stagetest: the function does not fire its timers at a job's end (FireAtEnd is not set)")
	}
	return s.fire(ctx, fn, time.Unix(1<<62/1_000_000_000, 0))
}

func (s *State) fire(ctx context.Context, fn stages.StatefulFunc, until time.Time) ([]stages.Message, error) {
	var out []stages.Message
	for {
		name, at, ok := s.nextDue(until)
		if !ok {
			return out, nil
		}
		var fired []stages.Message
		err := s.attempt(func() error {
			delete(s.timers, name)
			var err error
			fired, err = fn.OnTimer(ctx, name, at, funcState{s, true})
			return err
		})
		if err != nil {
			if !stages.IsPermanent(err) {
				return out, fmt.Errorf("timer %q at %s: %w", name, at.Format(time.RFC3339Nano), err)
			}
			delete(s.timers, name)
			continue
		}
		out = append(out, fired...)
	}
}

// nextDue is the earliest timer at or before until (by name among equal times).
func (s *State) nextDue(until time.Time) (name string, at time.Time, ok bool) {
	for n, t := range s.timers {
		if t.After(until) {
			continue
		}
		if !ok || t.Before(at) || t.Equal(at) && n < name {
			name, at, ok = n, t, true
		}
	}
	return name, at, ok
}

// attempt runs f, and puts the state back as it was when f fails.
func (s *State) attempt(f func() error) error {
	values, timers, holds, recorded := maps.Clone(s.values), maps.Clone(s.timers), maps.Clone(s.holds), maps.Clone(s.recorded)
	err := f()
	if err != nil {
		s.values, s.timers, s.holds, s.recorded = values, timers, holds, recorded
	}
	return err
}

// funcState refuses timers to a function that has no OnTimer to fire them, as the runtime does.
type funcState struct {
	*State
	timers bool
}

func (s funcState) SetTimer(ctx context.Context, name string, at time.Time) error {
	if !s.timers {
		return stages.Permanent(errors.New("the stateful function set a timer, but it has no OnTimer to fire it"))
	}
	return s.State.SetTimer(ctx, name, at)
}

// JSON returns a message with key and a JSON object payload as the runtime hands it to a sink or a
// stage kind: not decoded yet, so that a kind that reads m.Value without calling m.Decode first
// fails here as it would in a pipeline. (Process decodes it for a function, as the runtime does.)
// It fails the test when the payload is not a JSON object.
func JSON(t testing.TB, key, payload string) stages.Message {
	t.Helper()
	m := stages.NewMessage(key, []byte(payload), nil)
	check := m // decoding a copy leaves m undecoded
	if err := check.Decode(); err != nil {
		t.Fatalf("stagetest.JSON(%q): %v", payload, err)
	}
	return m
}

// Env returns an Env for a kind's constructor: pipeline "test", node "test", a logger that writes
// to the test's log, the wall clock (stages.SystemClock; set Clock to drive time yourself), a
// no-op Meter, an HTTP client with a 10 s timeout, an empty standard input, and standard output
// written to stdout (nil: discarded). Functions is nil (the registered functions), and Redact
// returns text as it is.
func Env(t testing.TB, stdout io.Writer) stages.Env {
	if stdout == nil {
		stdout = io.Discard
	}
	return stages.Env{
		Pipeline:       "test",
		Node:           "test",
		Logger:         slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Clock:          stages.SystemClock{},
		Meter:          noop.NewMeterProvider().Meter("stagetest"),
		HTTPClient:     &http.Client{Timeout: 10 * time.Second},
		Stdin:          strings.NewReader(""),
		Stdout:         stages.NewLineWriter(stdout, 4096),
		MaxMessageSize: 1 << 20,
		Redact:         func(text string) string { return text },
	}
}

// testLog writes log lines to a test's log.
type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Compile compiles a pipeline's text (HCL, with every registered kind and function) into its
// plan, whose blocks (plan.Sinks, plan.Stages, plan.Sources) the kinds' constructors take. It
// fails the test with the diagnostics when the text is not a valid pipeline.
func Compile(t testing.TB, src string) *flow.Plan {
	t.Helper()
	cfg, diags := flow.LoadSource(map[string][]byte{"pipeline.hcl": []byte(src)})
	if diags.HasErrors() {
		t.Fatalf("stagetest.Compile: %s", diags.Error())
	}
	plan, diags := flow.Compile(cfg, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatalf("stagetest.Compile: %s", diags.Error())
	}
	return plan
}

// Sink makes the sink named name of plan with its kind's constructor and opens it (stages.Opener),
// as the runtime does before the first delivery; it closes the sink when the test ends, if it has
// Close (a test that checks what Close does calls it itself).
func Sink(t testing.TB, plan *flow.Plan, name string, env stages.Env) stages.Sink {
	t.Helper()
	for _, s := range plan.Sinks {
		if s.Name != name {
			continue
		}
		kind, err := stages.SinkKindOf(s)
		if err != nil {
			t.Fatal(err)
		}
		env.Node = name
		sink, err := kind.New(s, env)
		if err != nil {
			t.Fatalf("sink %s: %v", name, err)
		}
		if c, ok := sink.(io.Closer); ok {
			t.Cleanup(func() { _ = c.Close() }) // a second Close must be harmless, as in the runtime
		}
		if o, ok := sink.(stages.Opener); ok {
			if err := o.Open(context.Background()); err != nil {
				t.Fatalf("sink %s: open: %v", name, err)
			}
		}
		return sink
	}
	t.Fatalf("the plan has no sink %q", name)
	return nil
}
