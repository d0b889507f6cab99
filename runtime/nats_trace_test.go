package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flowrun/runtime"
)

// TestNATSTraceCrossesTheRoundTrip: messages published by the test's NATS client, each with a
// traceparent and a tracestate of its own, go through the nats source, a map and the nats sink to
// another stream, with tracing on (every trace sampled): each comes out with a traceparent of the
// same trace and another span, a child of the one it was published with: that span is one of
// flowrun's, whose parents, followed through flowrun's spans, lead to the publisher's span; the
// tracestate travels unchanged. A consumer outside flowrun thus continues the producer's trace.
func TestNATSTraceCrossesTheRoundTrip(t *testing.T) {
	const n = 20
	js := natsJS(t)
	in, out := natsName(t), natsName(t)
	natsStream(t, js, in, nil)
	natsStream(t, js, out, nil)
	for i := range n {
		m := nats.NewMsg(fmt.Sprintf("%s.k%d", in, i%10))
		m.Data = fmt.Appendf(nil, `{"i":%d}`, i)
		m.Header.Set("traceparent", natsTraceparent(i))
		m.Header.Set("tracestate", fmt.Sprintf("shop=%d", i))
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	plan := buildSource(t, natsRoundTripPipeline("", natsURL(), in, out, false))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c := server.open(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log), TracerProvider: tp})
		ended <- err
	}()
	waitFor(t, "every message acknowledged by the sink", func() bool {
		select {
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		default:
		}
		return acked(t, c, plan.KeyPrefix, "mark.out", 4, "jet_out") == n
	})
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}

	spans := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.SpanContext().SpanID()] = s
	}
	var example string
	natsEach(t, js, out, n, func(m *jetstream.RawStreamMsg, i int) {
		sent := natsTraceparent(i)
		got := m.Header.Get("traceparent")
		sentTrace, sentSpan := traceParts(t, sent)
		gotTrace, gotSpan := traceParts(t, got)
		if gotTrace != sentTrace || gotSpan == sentSpan {
			t.Errorf("message %d published with %s came out with %q: want trace %s and another span", i, sent, got, sentTrace)
			return
		}
		if ts := m.Header.Get("tracestate"); ts != fmt.Sprintf("shop=%d", i) {
			t.Errorf("message %d came out with tracestate %q, want shop=%d", i, ts, i)
		}
		// From the span it came out with, up through flowrun's spans, to the publisher's.
		var chain []string
		id, err := trace.SpanIDFromHex(gotSpan)
		if err != nil {
			t.Fatal(err)
		}
		for {
			sp, ok := spans[id]
			if !ok {
				break
			}
			if sp.SpanContext().TraceID().String() != sentTrace {
				t.Errorf("message %d: span %q is in trace %s", i, sp.Name(), sp.SpanContext().TraceID())
			}
			chain = append(chain, sp.Name())
			id = sp.Parent().SpanID()
		}
		if len(chain) == 0 || id.String() != sentSpan {
			t.Errorf("message %d: from its span up through flowrun's spans %v to span %s, want to the publisher's %s", i, chain, id, sentSpan)
			return
		}
		example = fmt.Sprintf("published with %s, came out with %s; its span's parents: %s, then the publisher's span", sent, got, strings.Join(chain, " <- "))
	})
	t.Logf("%d messages, each out with a child of its trace: %s", n, example)
}

// traceParts returns a W3C traceparent's trace ID and span ID, failing the test when it is not one.
func traceParts(t *testing.T, tp string) (traceID, spanID string) {
	t.Helper()
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("%q is not a traceparent", tp)
	}
	return parts[1], parts[2]
}
