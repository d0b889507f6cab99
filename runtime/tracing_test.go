package runtime_test

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

const tracedPipeline = `
pipeline "traced" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = 4
  output   = topic.in
  template = { k = "k${index}", n = index }
}
stage "a" {
  kind  = "map"
  input = topic.in
  set   = { a = true }
}
stage "b" {
  kind  = "filter"
  input = stage.a
  where = true
}
stage "c" {
  kind   = "map"
  input  = stage.b
  output = topic.out
  set    = { c = true }
}
topic "out" { partitions = 2 }
sink "print" {
  kind  = "stdout"
  input = topic.out
}
`

// TestTraceFollowsEveryHop runs a source, three stages and a sink, tracing every message: each
// message's spans form one trace, send -> process a -> process b -> process c -> process print.
func TestTraceFollowsEveryHop(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	plan := buildSource(t, tracedPipeline)
	runJob(t, server.open(t), plan, runtime.Options{TracerProvider: tp})

	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byTrace[s.SpanContext().TraceID()] = append(byTrace[s.SpanContext().TraceID()], s)
	}
	if len(byTrace) != 4 {
		t.Fatalf("%d traces, want one per message (4)", len(byTrace))
	}
	chain := []struct {
		name string
		kind trace.SpanKind
	}{
		{"send in", trace.SpanKindProducer},
		{"process in", trace.SpanKindConsumer},    // stage a
		{"process a.out", trace.SpanKindConsumer}, // stage b
		{"process b.out", trace.SpanKindConsumer}, // stage c
		{"process out", trace.SpanKindConsumer},   // sink print
	}
	for id, spans := range byTrace {
		if len(spans) != len(chain) {
			t.Errorf("trace %s has %d spans, want %d", id, len(spans), len(chain))
			continue
		}
		byName := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range spans {
			byName[s.Name()] = s
		}
		var parent trace.SpanID
		for i, hop := range chain {
			s, ok := byName[hop.name]
			if !ok {
				t.Errorf("trace %s has no span %q", id, hop.name)
				break
			}
			if s.SpanKind() != hop.kind {
				t.Errorf("span %q is a %v span, want %v", hop.name, s.SpanKind(), hop.kind)
			}
			if i == 0 && s.Parent().IsValid() {
				t.Errorf("the source's span has a parent")
			}
			if i > 0 && s.Parent().SpanID() != parent {
				t.Errorf("span %q's parent is %s, want the previous hop's %s", hop.name, s.Parent().SpanID(), parent)
			}
			parent = s.SpanContext().SpanID()
		}
	}
}

// TestUnsampledMessagesTakeTheFastPath traces with a sampler that samples nothing: no span is
// recorded past the source, and every entry carries its source's trace context unchanged.
func TestUnsampledMessagesTakeTheFastPath(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c := server.open(t)
	plan := buildSource(t, tracedPipeline)
	runJob(t, c, plan, runtime.Options{TracerProvider: tp})
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans recorded, want none", n)
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	parents := map[string]string{} // message n -> traceparent in topic in
	for _, topic := range []string{"in", "out"} {
		for p := 0; p < 2; p++ {
			recs, err := c.Read(context.Background(), keys.Stream(topic, p), "0", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				n := jsonObject(t, string(r.Payload))["n"].(float64)
				k := fmt.Sprint(n)
				if r.TraceParent == "" || r.TraceParent[len(r.TraceParent)-2:] != "00" {
					t.Errorf("entry of message %v in %s carries traceparent %q, want an unsampled one", n, topic, r.TraceParent)
				}
				if prev, ok := parents[k]; ok && prev != r.TraceParent {
					t.Errorf("message %v's traceparent changed from %s to %s", n, prev, r.TraceParent)
				}
				parents[k] = r.TraceParent
			}
		}
	}
	if len(parents) != 4 {
		t.Errorf("traceparents of %d messages, want 4", len(parents))
	}
}
