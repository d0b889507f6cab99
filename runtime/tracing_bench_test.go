package runtime

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkStartUnsampled is what tracing at 1 % costs a stage that starts traces for each message
// the sampler drops: the SDK's Start, which makes IDs, a span and a context all the same.
func BenchmarkStartUnsampled(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := newTracing(tp, func(s string) string { return s })
	n := &node{name: "s1", spanName: "process in", startsTraces: true}
	b.ReportAllocs()
	for b.Loop() {
		m := message{}
		_, span := tr.startProcess(context.Background(), n, &m)
		tr.endProcess(span, result{}, nil)
	}
}
