package runtime_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestTraceFollowsEveryHop runs a source, three stages and a sink, tracing every message: each
// message's spans form one trace, send -> process a -> process b -> process c -> process print.
func TestTraceFollowsEveryHop(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	plan := buildTestdata(t, "traced")
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

// everyOtherRoot samples every other trace it starts: a deterministic ratio sampler.
type everyOtherRoot struct{ n atomic.Int64 }

func (s *everyOtherRoot) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if s.n.Add(1)%2 == 0 {
		return sdktrace.SamplingResult{Decision: sdktrace.Drop}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample}
}

func (s *everyOtherRoot) Description() string { return "every other root" }

// TestUnsampledTracesLeaveNoTraceContext samples every other message at its source, by the
// TracerProvider's sampler or before any span by Options.SampleRoot: a sampled message has its five
// spans and carries its trace context in every entry; an unsampled one has no span anywhere and its
// entries carry no trace context at all (the cost of tracing off).
func TestUnsampledTracesLeaveNoTraceContext(t *testing.T) {
	var asked atomic.Int64
	everyOther := func() bool { return asked.Add(1)%2 == 1 }
	for _, tc := range []struct {
		name       string
		sampler    sdktrace.Sampler
		sampleRoot func() bool
	}{
		{"by the sampler", sdktrace.ParentBased(&everyOtherRoot{}), nil},
		{"before the span", sdktrace.ParentBased(sdktrace.AlwaysSample()), everyOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler), sdktrace.WithSpanProcessor(rec))
			defer func() { _ = tp.Shutdown(context.Background()) }()
			c := server.open(t)
			plan := buildTestdata(t, "traced")
			// Unfused, so that the entries between the stages are there to look at.
			runJob(t, c, plan, runtime.Options{TracerProvider: tp, SampleRoot: tc.sampleRoot, NoFusion: true})
			checkEveryOtherTraced(t, c, plan.KeyPrefix, rec)
		})
	}
	if asked.Load() != 4 {
		t.Errorf("SampleRoot was asked %d times, want once per message entering (4)", asked.Load())
	}
}

func checkEveryOtherTraced(t *testing.T, c *redis.Client, prefix string, rec *tracetest.SpanRecorder) {
	t.Helper()
	spans := map[string]int{} // trace ID -> spans
	for _, s := range rec.Ended() {
		spans[s.SpanContext().TraceID().String()]++
	}
	if len(spans) != 2 {
		t.Fatalf("%d traces recorded, want 2 of the 4 messages", len(spans))
	}
	for id, n := range spans {
		if n != 5 {
			t.Errorf("trace %s has %d spans, want 5", id, n)
		}
	}
	keys := redis.Keys{Prefix: prefix}
	for _, topic := range []string{"in", "a.out", "b.out", "out"} {
		traced, untraced := 0, 0
		for p := 0; p < 2; p++ {
			recs, err := c.Read(context.Background(), keys.Stream(topic, p), "0", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				switch {
				case r.TraceParent == "":
					untraced++
				case spans[r.TraceParent[3:35]] == 5 && strings.HasSuffix(r.TraceParent, "-01"):
					traced++
				default:
					t.Errorf("an entry in %s carries traceparent %q, of no recorded trace", topic, r.TraceParent)
				}
			}
		}
		if traced != 2 || untraced != 2 {
			t.Errorf("%s: %d entries with a sampled trace and %d without trace context, want 2 and 2", topic, traced, untraced)
		}
	}
}

// TestTracesStartWhereMessagesEnter feeds a topic that no node writes from outside: a message
// without trace context starts a trace at the stage that reads it, and one whose trace context
// says "not sampled" records no span and keeps its context unchanged through every hop.
func TestTracesStartWhereMessagesEnter(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c := server.open(t)
	// The traced pipeline without its source: topic in is fed from outside.
	plan := buildTestdata(t, "traced/traced.hcl")
	ctx := context.Background()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	const unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	prod, err := c.NewProducer(redis.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []redis.Entry{
		{Payload: []byte(`{"k":"x","n":1}`)},
		{Payload: []byte(`{"k":"y","n":2}`), TraceParent: unsampled},
	} {
		if err := prod.Add(ctx, keys.Stream("in", 0), e); err != nil {
			t.Fatal(err)
		}
	}
	if err := prod.Close(ctx); err != nil {
		t.Fatal(err)
	}
	runJob(t, c, plan, runtime.Options{TracerProvider: tp})

	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	sort.Strings(names)
	if want := "[process a.out process b.out process in process out]"; fmt.Sprint(names) != want {
		t.Errorf("spans %v, want %s: one trace, started by stage a", names, want)
	}
	for p := 0; p < 2; p++ {
		recs, err := c.Read(ctx, keys.Stream("out", p), "0", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			n := jsonObject(t, string(r.Payload))["n"].(float64)
			if n == 2 && r.TraceParent != unsampled {
				t.Errorf("the unsampled message left with traceparent %q, want %s unchanged", r.TraceParent, unsampled)
			}
			if n == 1 && (len(r.TraceParent) != 55 || !strings.HasSuffix(r.TraceParent, "-01")) {
				t.Errorf("the message without trace context left with traceparent %q, want a sampled one", r.TraceParent)
			}
		}
	}
}
