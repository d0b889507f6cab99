package runtime_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
)

// test_opened (a source kind and a stage kind of the tests) works only once it was opened, and
// counts its opens and closes: the runtime brackets a run of every kind with Open and Close.
func init() {
	stages.RegisterSource(stages.SourceKind{
		Spec: &flow.Kind{Name: "test_opened", Doc: "Produces 10 messages, once opened (a source of the tests).",
			Example: "source \"s\" {\n  kind   = \"test_opened\"\n  output = topic.in\n}"},
		New: func(*flow.Source, stages.Env) (stages.Source, error) { return &openedSource{}, nil },
	})
	stages.RegisterStage(stages.StageKind{
		Spec: &flow.Kind{Name: "test_opened", Doc: "Passes messages on, once opened (a stage of the tests).",
			Example: "stage \"p\" {\n  kind  = \"test_opened\"\n  input = topic.in\n}"},
		Traits: stages.StageTraits{Inline: true},
		New:    func(s *flow.Stage, _ stages.Env) (stages.Processor, error) { return &openedStage{out: s.Output}, nil },
	})
}

var opens, closes atomic.Int64

type openedSource struct{ open bool }

func (s *openedSource) Open(context.Context) error { s.open = true; opens.Add(1); return nil }
func (s *openedSource) Close() error               { closes.Add(1); return nil }

func (s *openedSource) Produce(ctx context.Context, out stages.Emitter) error {
	if !s.open {
		return errors.New("produced before it was opened")
	}
	run := stages.NewRunID()
	for i := range 10 {
		if err := out.Emit(ctx, stages.Message{Value: map[string]any{"i": i}}, stages.Origin{ID: run + ":" + itoa(int64(i))}); err != nil {
			return err
		}
	}
	return nil
}

type openedStage struct {
	out  *flow.Topic
	open atomic.Bool
}

func (s *openedStage) Open(context.Context) error { s.open.Store(true); opens.Add(1); return nil }
func (s *openedStage) Close() error               { closes.Add(1); return nil }

func (s *openedStage) Process(_ context.Context, m *stages.Message, out []stages.Output) ([]stages.Output, error) {
	if !s.open.Load() {
		return out, stages.Permanent(errors.New("processed before it was opened"))
	}
	return append(out, stages.Output{Topic: s.out, Message: *m}), nil
}

// TestKindsAreOpenedAndClosed: a source's and a stage's Open run before their first message and
// their Close when the run ends, as a sink's do.
func TestKindsAreOpenedAndClosed(t *testing.T) {
	opens.Store(0)
	closes.Store(0)
	plan := buildSource(t, `
pipeline "lifecycle" {}
topic "in" {}
source "s" {
  kind   = "test_opened"
  output = topic.in
}
stage "p" {
  kind  = "test_opened"
  input = topic.in
}
sink "out" {
  kind  = "stdout"
  input = stage.p
}
`)
	j := runJob(t, server.open(t), plan, runtime.Options{})
	if n := j.node(t, "p"); n.Out != 10 || n.DeadLettered != 0 {
		t.Fatalf("stage p: %+v\n%s", n, j.log)
	}
	if opens.Load() != 2 || closes.Load() != 2 {
		t.Fatalf("%d opens and %d closes, want 2 of each", opens.Load(), closes.Load())
	}
}
