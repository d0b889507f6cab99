package stages

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
)

func init() {
	// test.total keeps a running total of msg.n per key, passes each message on with it, and sets a
	// timer a minute of event time after the key's latest message, whose OnTimer reports the total
	// and forgets it.
	RegisterStateful("test.total", StatefulFunc{
		Process: func(ctx context.Context, m Message, state State) ([]Message, error) {
			v, _, err := state.Get(ctx, m.Key)
			if err != nil {
				return nil, err
			}
			total, _ := strconv.Atoi(string(v))
			n, _ := m.Value["n"].(json.Number).Int64()
			total += int(n)
			wm, err := state.Watermark(ctx)
			if err != nil {
				return nil, err
			}
			err = errors.Join(state.Put(ctx, m.Key, []byte(strconv.Itoa(total))),
				state.SetTimer(ctx, m.Key, wm.Add(time.Minute)))
			m.Value["total"] = total
			return []Message{m}, err
		},
		OnTimer: func(ctx context.Context, timer string, at time.Time, state State) ([]Message, error) {
			if timer == "panic" {
				panic("boom")
			}
			v, _, err := state.Get(ctx, timer)
			if err != nil {
				return nil, err
			}
			return []Message{{Key: timer, Value: map[string]any{"total": string(v), "at": at.UTC().Format(time.RFC3339)}}}, state.Delete(ctx, timer)
		},
		FireAtEnd: true,
	})
	// test.untimed keeps state but has no OnTimer: it may not set a timer.
	RegisterStateful("test.untimed", StatefulFunc{
		Process: func(ctx context.Context, m Message, state State) ([]Message, error) {
			return nil, state.SetTimer(ctx, "t", time.Now())
		},
	})
}

const statefulStages = `
stage "total" {
  kind       = "go"
  func       = "test.total"
  input      = topic.in
  output     = topic.a
  event_time = msg.at
}
stage "untimed" {
  kind   = "go"
  func   = "test.untimed"
  input  = topic.in
  output = topic.b
}
sink "b" {
  kind  = "stdout"
  input = topic.b
}
`

// A go stage is stateful when its function is, and only then fires timers.
func TestStatefulGoStage(t *testing.T) {
	p := plan(t, statefulStages+sinkA)
	total, untimed := p.Stage("total"), p.Stage("untimed")
	kind, err := StageKindOf(total)
	if err != nil {
		t.Fatal(err)
	}
	if tr := kind.TraitsFor(total.Config); !tr.Stateful || tr.Inline {
		t.Fatalf("traits of a stage of test.total: %+v", tr)
	}
	if tr := kind.TraitsFor(untimed.Config); !tr.Stateful {
		t.Fatalf("traits of a stage of test.untimed: %+v", tr)
	}
	if tr := kind.TraitsFor(plan(t, splitStage+sinkA).Stage("split").Config); tr.Stateful {
		t.Fatalf("traits of a stage of a plain function: %+v", tr)
	}
	if _, err := Compile(total, Env{}); err == nil {
		t.Fatal("a stateful function's stage was made as a stateless one")
	}

	state := newMemState()
	state.eventTime = flow.EventTimeOf(total)
	proc, err := CompileStateful(total, Env{})
	if err != nil {
		t.Fatal(err)
	}
	for i, at := range []int64{60_000, 30_000} {
		m := NewMessage("k", []byte(`{"n": 5, "at": `+strconv.FormatInt(at, 10)+`}`), nil)
		state.observe(&m)
		outs, err := proc.Processor.Process(context.Background(), state, &m, nil)
		if err != nil || len(outs) != 1 || outs[0].Topic != total.Output || outs[0].Message.Value["total"] != 5*(i+1) {
			t.Fatalf("message %d: %+v, %v", i, outs, err)
		}
	}
	// The function sees the partition's watermark, the latest event time: the timer is a minute
	// past the latest of them.
	if state.timers["k"] != 120_000 || string(state.values["k"]) != "10" {
		t.Fatalf("state after two messages: %v, timers %v", state.values, state.timers)
	}
	th := proc.TimerHandler
	if th == nil || !proc.FireAtEnd {
		t.Fatalf("a stateful function with OnTimer and FireAtEnd declares timers %v, fired at the end %v", th, proc.FireAtEnd)
	}
	outs, err := th.OnTimer(context.Background(), state, "k", time.UnixMilli(120_000), nil)
	if err != nil || len(outs) != 1 || outs[0].Topic != total.Output || outs[0].Message.Value["total"] != "10" || len(state.values) != 0 {
		t.Fatalf("OnTimer: %+v, %v; state %v", outs, err, state.values)
	}
	if _, err := th.OnTimer(context.Background(), state, "panic", time.Time{}, nil); !IsPermanent(err) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("a panicking OnTimer: %v", err)
	}
	bad := NewMessage("k", []byte(`{"n": 1, "at": "yesterday"}`), nil)
	if _, err := proc.Processor.Process(context.Background(), state, &bad, nil); !IsPermanent(err) {
		t.Fatalf("an event time of neither form: %v", err)
	}

	proc, err = CompileStateful(untimed, Env{})
	if err != nil {
		t.Fatal(err)
	}
	if proc.TimerHandler != nil || proc.FireAtEnd {
		t.Fatal("a stateful function without OnTimer declares timers: its stage would look for due timers in every batch")
	}
	m := NewMessage("k", []byte(`{}`), nil)
	m.EntryTime = time.UnixMilli(1)
	if _, err := proc.Processor.Process(context.Background(), newMemState(), &m, nil); !IsPermanent(err) || !errors.Is(err, errNoOnTimer) {
		t.Fatalf("a timer set without OnTimer: %v", err)
	}

	// A test's mock (Env.Functions) stands in for a stateful function as a plain one.
	mocked, err := CompileStateful(total, Env{Functions: func(name string) (Func, bool) {
		return func(_ context.Context, m Message) ([]Message, error) { return []Message{m}, nil }, name == "test.total"
	}})
	if err != nil {
		t.Fatal(err)
	}
	if mocked.TimerHandler != nil {
		t.Fatal("a mock of a stateful function fires its timers")
	}
	mm := NewMessage("k", []byte(`{"n": 1}`), nil)
	if outs, err := mocked.Processor.Process(context.Background(), newMemState(), &mm, nil); err != nil || len(outs) != 1 || outs[0].Message.Value["total"] != nil {
		t.Fatalf("the mock: %+v, %v", outs, err)
	}
}

const splitStage = `
stage "split" {
  kind   = "go"
  func   = "test.split"
  input  = topic.in
  output = topic.a
}
`

// validate says, at the attribute, that a stateful function's stage needs a lease, and that a plain
// function has no use for event_time.
func TestStatefulGoStageChecks(t *testing.T) {
	src := `
pipeline "t" {}
topic "in" {}
source "s" {
  kind   = "stdin"
  output = topic.in
}
stage "total" {
  kind     = "go"
  func     = "test.total"
  input    = topic.in
  ordering = "none"
}
stage "split" {
  kind       = "go"
  func       = "test.split"
  input      = stage.total
  event_time = msg.at
}
sink "out" {
  kind  = "stdout"
  input = stage.split
}
`
	cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	_, diags = flow.Compile(cfg, flow.Options{GoFuncs: Names()})
	want := map[int]string{
		12: `The go stage "total" keeps state per input partition, which one process at a time must own`,
		18: `"test.split" keeps no state, so it has no use for event time`,
	}
	if len(diags) != len(want) {
		t.Fatalf("want %d diagnostics, got %s", len(want), diags)
	}
	for _, d := range diags {
		if d.Subject == nil || !strings.Contains(d.Detail, want[d.Subject.Start.Line]) {
			t.Errorf("unexpected diagnostic at %v: %s: %s", d.Subject, d.Summary, d.Detail)
		}
	}
}

func TestRegisterStatefulRefusesMistakes(t *testing.T) {
	noop := func(context.Context, Message, State) ([]Message, error) { return nil, nil }
	for name, fn := range map[string]StatefulFunc{"": {Process: noop}, "test.nil": {}, "test.split": {Process: noop}, "test.total": {Process: noop}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RegisterStateful(%q) did not panic", name)
				}
			}()
			RegisterStateful(name, fn)
		}()
	}
	if names := strings.Join(Names(), ","); !strings.Contains(names, "test.split") || !strings.Contains(names, "test.total") {
		t.Fatalf("Names() lists %s, not the plain and the stateful functions", names)
	}
}
