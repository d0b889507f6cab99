package runtime

import (
	"context"
	"errors"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Messages carry W3C trace context (traceparent, tracestate) in their entries. Sources start a trace
// per message with a producer span; every stage and sink continues it with a processing span, child
// of the span that wrote the message, and writes its outputs with its own span's context; so one
// trace shows every hop. Spans follow the OpenTelemetry messaging conventions.
//
// Traces start where messages enter the pipeline: at sources, and at the nodes that read a topic
// no node of the plan writes (what applications and redis-cli XADD). A trace started here that the
// sampler drops leaves no trace context in the entries at all, so that unsampled messages cost what
// they cost with tracing off (no traceparent field for Redis to store and every hop to read), and a
// message without trace context on a topic the pipeline writes is one of those: no span.
//
// A message whose trace context says "not sampled" (from outside) takes a fast path: no span, its
// trace context copied to its outputs as it is, as W3C propagation asks. Without a TracerProvider
// nothing is traced and trace context passes through.

// tracing starts the spans of a run.
type tracing struct {
	tracer trace.Tracer // nil: tracing is off
	// sampleRoot decides about new traces before a span is built (Options.SampleRoot); nil: the
	// tracer's sampler does.
	sampleRoot func() bool
	prop       propagation.TraceContext
	redact     func(string) string // hides secrets in recorded errors
}

func newTracing(tp trace.TracerProvider, sampleRoot func() bool, redact func(string) string) tracing {
	if tp == nil {
		return tracing{}
	}
	return tracing{tracer: tp.Tracer("github.com/flowrun/flowrun/runtime"), sampleRoot: sampleRoot, redact: redact}
}

// dropsRoot reports whether a trace that would start here is not sampled, decided before any span
// is built (sampleRoot): the SDK's Start with a dropping sampler costs more than the rest of an
// unsampled message's hop.
func (t tracing) dropsRoot() bool { return t.sampleRoot != nil && !t.sampleRoot() }

// messagingSystem names Redis streams in the messaging.system attribute.
const messagingSystem = "redis"

// startProcess starts the span of node n processing m, continuing m's trace, and sets the trace
// context m's outputs carry. It returns a nil span on the fast path.
func (t tracing) startProcess(ctx context.Context, n *node, m *message) (context.Context, trace.Span) {
	m.out = m.trace
	if t.tracer == nil {
		return ctx, nil
	}
	if m.trace.parent == "" && !n.startsTraces && !m.trace.dropped {
		return ctx, nil // an unsampled trace started upstream
	}
	if m.trace.parent != "" && !sampled(m.trace.parent) {
		return ctx, nil
	}
	if m.trace.parent == "" && t.dropsRoot() {
		return ctx, nil // a new trace, not sampled: no trace context goes on either
	}
	if m.trace.parent != "" {
		ctx = t.prop.Extract(ctx, carrier{&m.trace})
	}
	destination := n.inputName()
	ctx, span := t.tracer.Start(ctx, n.processSpan(), trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		// Not sampled: no attributes to build, and a trace this node started goes no further. A
		// continued one (its context in m.trace) keeps passing on as it came.
		return ctx, nil
	}
	span.SetAttributes(
		attribute.String("messaging.system", messagingSystem),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.name", destination),
		attribute.String("messaging.destination.partition.id", strconv.Itoa(m.partition)),
		attribute.String("messaging.consumer.group.name", n.group),
		attribute.String("messaging.message.id", m.id),
		attribute.String("flowrun.node", n.name),
		attribute.String("flowrun.node.type", n.typ),
		attribute.String("flowrun.node.kind", n.kind),
	)
	if m.msg.Key != "" {
		span.SetAttributes(attribute.String("messaging.redis.message.key", m.msg.Key))
	}
	if span.SpanContext().IsValid() {
		m.out = traceContext{}
		t.prop.Inject(ctx, carrier{&m.out})
	}
	return ctx, span
}

// traceOf is the trace context an entry arrived with. An invalid traceparent never gets this far:
// DecodeEntry drops it with its tracestate, so that it is neither used nor passed on, as W3C Trace
// Context asks. No node of the pipeline wrote such a traceparent, so the message is treated as one
// from outside without trace context: a traced node starts a trace for it, even on a topic the
// pipeline writes (where a message without trace context is one whose trace was not sampled
// upstream, and gets no span).
func traceOf(e redis.Entry) traceContext {
	return traceContext{parent: e.TraceParent, state: e.TraceState, dropped: e.TraceDropped}
}

// endProcess ends a processing span with the outcome of the message.
func (t tracing) endProcess(span trace.Span, res result, err error) {
	if span == nil {
		return
	}
	switch {
	case len(res.deadLetters) > 0:
		span.SetStatus(codes.Error, "dead-lettered")
		span.SetAttributes(attribute.Bool("flowrun.dead_lettered", true))
	case len(res.retries) > 0:
		span.SetAttributes(attribute.Bool("flowrun.retry_scheduled", true))
	case res.abandoned:
		span.SetAttributes(attribute.Bool("flowrun.abandoned", true))
	}
	if err != nil {
		span.RecordError(errors.New(t.redact(err.Error())))
	}
	span.End()
}

// startSend starts the producer span of a source writing a new message to a topic, and returns the
// trace context the message's entry carries: none without tracing or when the trace is not sampled.
//
// A source that got trace context from its caller (stages.ContextWithTrace: an HTTP request's
// traceparent) continues the caller's trace: the span is a child of the caller's, and without
// tracing, or when the caller's trace is not sampled, the message carries the caller's trace
// context as it came (an invalid one is ignored).
func (t tracing) startSend(ctx context.Context, n *node, topic string) (trace.Span, traceContext) {
	caller := false
	if parent, state := stages.TraceFrom(ctx); parent != "" {
		tc := traceContext{parent: parent, state: state}
		remote := trace.SpanContextFromContext(t.prop.Extract(ctx, carrier{&tc}))
		if remote.IsValid() {
			if t.tracer == nil || !remote.IsSampled() {
				return nil, tc
			}
			ctx, caller = trace.ContextWithRemoteSpanContext(ctx, remote), true
		}
	}
	if t.tracer == nil || (!caller && t.dropsRoot()) {
		return nil, traceContext{}
	}
	ctx, span := t.tracer.Start(ctx, "send "+topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", messagingSystem),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.destination.name", topic),
			attribute.String("flowrun.node", n.name),
			attribute.String("flowrun.node.type", n.typ),
			attribute.String("flowrun.node.kind", n.kind),
		))
	var tc traceContext
	if span.SpanContext().IsSampled() {
		t.prop.Inject(ctx, carrier{&tc})
	}
	return span, tc
}

// sampled reads the sampled flag of a traceparent ("00-<trace id>-<span id>-<flags>") without
// parsing the rest: the fast path of unsampled messages.
func sampled(traceparent string) bool {
	if len(traceparent) < 55 {
		return true // not the usual form: let the propagator judge it
	}
	f := traceparent[54]
	var v byte
	switch {
	case f >= '0' && f <= '9':
		v = f - '0'
	case f >= 'a' && f <= 'f':
		v = f - 'a' + 10
	default:
		return true
	}
	return v&1 == 1
}

// carrier lets the propagator read and write a message's trace context.
type carrier struct{ tc *traceContext }

func (c carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.tc.parent
	case "tracestate":
		return c.tc.state
	}
	return ""
}

func (c carrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.tc.parent = value
	case "tracestate":
		c.tc.state = value
	}
}

func (c carrier) Keys() []string { return []string{"traceparent", "tracestate"} }
