package stages

import (
	"context"
	"maps"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// memState is a State in memory for the tests of the stateful kinds: one partition (partition 2),
// processed as the runtime processes it. A batch's messages go one after another, then the timers
// that its watermark made due fire, earliest first; an attempt that fails leaves nothing behind.
type memState struct {
	values    map[string][]byte
	timers    map[string]int64
	holds     map[string]int64
	watermark int64 // Unix ms
	// eventTime is the stage's event time, which the state measures the watermark by, as the
	// runtime does for a partition that only the outside writes.
	eventTime *expr.Program
	late      int
	dups      int
	// self is the State that the kinds get: the memState, or a test's wrapper of it.
	self State
}

func newMemState() *memState {
	return &memState{values: map[string][]byte{}, timers: map[string]int64{}, holds: map[string]int64{}}
}

func (s *memState) Get(_ context.Context, key string) ([]byte, bool, error) {
	v, ok := s.values[key]
	return v, ok, nil
}

func (s *memState) Put(_ context.Context, key string, value []byte) error {
	s.values[key] = append([]byte(nil), value...)
	return nil
}

func (s *memState) Delete(_ context.Context, key string) error {
	delete(s.values, key)
	return nil
}

func (s *memState) SetTimer(_ context.Context, name string, at time.Time) error {
	s.timers[name] = at.UnixMilli()
	return nil
}

func (s *memState) CancelTimer(_ context.Context, name string) error {
	delete(s.timers, name)
	return nil
}

func (s *memState) Hold(_ context.Context, name string, at time.Time) error {
	s.holds[name] = at.UnixMilli()
	return nil
}

func (s *memState) Release(_ context.Context, name string) error {
	delete(s.holds, name)
	return nil
}

func (s *memState) Record(o Outcome) {
	switch o {
	case Late:
		s.late++
	case Duplicate:
		s.dups++
	}
}

func (s *memState) Partition() int { return 2 }

// state is the State the kinds get.
func (s *memState) state() State {
	if s.self != nil {
		return s.self
	}
	return s
}

// observe moves the watermark to a message's event time, as the runtime does before Process.
func (s *memState) observe(m *Message) {
	if at, err := EventTime(s.eventTime, m); err == nil {
		s.watermark = max(s.watermark, at.UnixMilli())
	}
}

func (s *memState) Watermark(context.Context) (time.Time, error) {
	if s.watermark == 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(s.watermark), nil
}

// attempt runs f on the state, and puts the state back as it was when f fails.
func (s *memState) attempt(f func() error) error {
	values, timers, holds := maps.Clone(s.values), maps.Clone(s.timers), maps.Clone(s.holds)
	err := f()
	if err != nil {
		s.values, s.timers, s.holds = values, timers, holds
	}
	return err
}

// batch processes payloads as one batch of partition 2: it returns the outputs, and each payload's
// error (nil for those that went through).
func (s *memState) batch(t *testing.T, proc StatefulStage, payloads ...string) ([]Output, []error) {
	t.Helper()
	ctx := context.Background()
	var outs []Output
	errs := make([]error, len(payloads))
	for i, p := range payloads {
		m := NewMessage("", []byte(p), nil)
		s.observe(&m)
		errs[i] = s.attempt(func() error {
			o, err := proc.Processor.Process(ctx, s.state(), &m, outs)
			if err == nil {
				outs = o
			}
			return err
		})
	}
	return s.fire(t, ctx, proc, s.watermark, outs), errs
}

// end fires every timer of a kind that asks for it (FireAtEnd), as a job does once its input is
// drained.
func (s *memState) end(t *testing.T, proc StatefulStage) []Output {
	t.Helper()
	if !proc.FireAtEnd {
		t.Fatal("the kind does not fire its timers at the end")
	}
	return s.fire(t, context.Background(), proc, math.MaxInt64, nil)
}

func (s *memState) fire(t *testing.T, ctx context.Context, proc StatefulStage, wm int64, outs []Output) []Output {
	t.Helper()
	th := proc.TimerHandler
	if th == nil {
		return outs
	}
	// The timers see the watermark they fire at, as the runtime's do (at a job's end, every time).
	saved := s.watermark
	s.watermark = max(s.watermark, wm)
	defer func() { s.watermark = saved }()
	fired := map[string]bool{}
	for {
		var due []string
		for name, at := range s.timers {
			if at <= wm && !fired[name] {
				due = append(due, name)
			}
		}
		if len(due) == 0 {
			return outs
		}
		sort.Slice(due, func(i, j int) bool {
			if s.timers[due[i]] != s.timers[due[j]] {
				return s.timers[due[i]] < s.timers[due[j]]
			}
			return due[i] < due[j]
		})
		for _, name := range due {
			if _, still := s.timers[name]; !still {
				continue // cancelled by a timer that fired before it
			}
			at := s.timers[name]
			fired[name] = true
			delete(s.timers, name)
			if err := s.attempt(func() error {
				o, err := th.OnTimer(ctx, s.state(), name, time.UnixMilli(at), outs)
				if err == nil {
					outs = o
				}
				return err
			}); err != nil {
				t.Fatalf("timer %q: %v", name, err)
			}
		}
	}
}

// keyCount is the count of keys the state keeps (KeyCountKey); 0 when it has none.
func (s *memState) keyCount(t *testing.T) int64 {
	t.Helper()
	n, err := keyCount(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// statefulProcessor compiles the stage name of the pipeline with a fresh memState.
func statefulProcessor(t testing.TB, stagesSrc, name string) (StatefulStage, *memState) {
	t.Helper()
	st := newMemState()
	p := plan(t, stagesSrc)
	st.eventTime = flow.EventTimeOf(p.Stage(name))
	proc, err := CompileStateful(p.Stage(name), Env{Node: name})
	if err != nil {
		t.Fatal(err)
	}
	return proc, st
}

// test_untimed_end and test_unmarked_results are stateful kinds whose declarations do not hold
// together: one fires timers at the end without a TimerHandler, the other writes results of its own
// (flow.Kind.Results) without saying how late they can be (OutputWatermarker).
func init() {
	for name, made := range map[string]StatefulStage{
		"test_untimed_end":      {Processor: passOn{}, FireAtEnd: true},
		"test_unmarked_results": {Processor: passOn{}},
	} {
		RegisterStage(StageKind{
			Spec: &flow.Kind{
				Name: name, Doc: "A stateful kind of the tests that declares too little.", Results: name == "test_unmarked_results",
				Example: "stage \"st\" {\n  kind  = \"" + name + "\"\n  input = topic.in\n}",
			},
			Traits:      StageTraits{Stateful: true},
			NewStateful: func(*flow.Stage, Env) (StatefulStage, error) { return made, nil },
		})
	}
}

type passOn struct{}

func (passOn) Process(_ context.Context, _ State, m *Message, out []Output) ([]Output, error) {
	return append(out, Output{Message: *m}), nil
}

// CompileStateful refuses a stateful stage whose kind declares what it does in a way that does not
// hold together, rather than run it without the half it left out.
func TestCompileStatefulChecksTheDeclarations(t *testing.T) {
	for _, kind := range []string{"test_untimed_end", "test_unmarked_results"} {
		p := plan(t, "stage \"st\" {\n  kind   = \""+kind+"\"\n  input  = topic.in\n  output = topic.a\n}\n"+sinkA)
		if _, err := CompileStateful(p.Stage("st"), Env{}); err == nil {
			t.Errorf("a stage of %s compiled", kind)
		}
	}
}
