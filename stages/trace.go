package stages

import "context"

// traceKey is the context key of a message's trace context.
type traceKey struct{}

type traceContext struct{ parent, state string }

// ContextWithTrace returns ctx carrying the W3C trace context (traceparent and tracestate) of the
// message being handled; the runtime sets it for the sinks and functions it calls.
func ContextWithTrace(ctx context.Context, traceparent, tracestate string) context.Context {
	return context.WithValue(ctx, traceKey{}, traceContext{traceparent, tracestate})
}

// TraceFrom returns the W3C trace context of the message being handled, for a sink that passes it
// on (as HTTP headers, say); empty when the message is not traced.
func TraceFrom(ctx context.Context) (traceparent, tracestate string) {
	t, _ := ctx.Value(traceKey{}).(traceContext)
	return t.parent, t.state
}
