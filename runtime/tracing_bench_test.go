package runtime

import (
	"context"
	"math/rand/v2"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkStartUnsampled is what tracing at 1 % costs a stage that starts traces for each message
// the sampler drops: with the SDK's sampler, its Start, which makes IDs, a span and a context all the
// same; with Options.SampleRoot, one draw before any of it.
func BenchmarkStartUnsampled(b *testing.B) {
	for _, bc := range []struct {
		name       string
		sampler    sdktrace.Sampler
		sampleRoot func() bool
	}{
		{"sdk sampler", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01)), nil},
		{"sample root", sdktrace.ParentBased(sdktrace.AlwaysSample()), func() bool { return rand.Float64() < 0.01 }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(bc.sampler))
			defer func() { _ = tp.Shutdown(context.Background()) }()
			tr := newTracing(tp, bc.sampleRoot, func(s string) string { return s })
			n := &node{name: "s1", spanName: "process in", startsTraces: true}
			b.ReportAllocs()
			for b.Loop() {
				m := message{}
				_, span := tr.startProcess(context.Background(), n, &m)
				tr.endProcess(span, result{}, nil)
			}
		})
	}
}
