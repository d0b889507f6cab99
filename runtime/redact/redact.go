// Package redact keeps secrets out of the runtime's log: a slog handler that passes every
// message and attribute through a redaction (flow.Plan.Redact) before the handler it wraps.
//
// It owns the wrapping of a logger. It does not know which values are secret (package flow
// does), nor redact errors that go into dead letters and retries (the runtime does, with the
// same function).
package redact

import (
	"context"
	"log/slog"
)

// Secrets must never reach a log: the values of sensitive variables are replaced by "(sensitive)" in
// every message and attribute the runtime logs (flow.Plan.Redact), and errors that go into dead
// letters and retries are redacted the same way. Redis passwords never get that far: transport/redis
// redacts them from every URL it prints.

// redactingHandler hides secrets from a log handler's records.
type redactingHandler struct {
	h      slog.Handler
	redact func(string) string
}

// Logger returns a logger that redacts what l logs, or l itself when there is nothing to hide.
func Logger(l *slog.Logger, redact func(string) string, hasSecrets bool) *slog.Logger {
	if !hasSecrets {
		return l
	}
	return slog.New(redactingHandler{h: l.Handler(), redact: redact})
}

func (r redactingHandler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r redactingHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, r.redact(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(r.attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r redactingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		clean[i] = r.attr(a)
	}
	return redactingHandler{h: r.h.WithAttrs(clean), redact: r.redact}
}

func (r redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{h: r.h.WithGroup(name), redact: r.redact}
}

// attr redacts an attribute's value: strings, errors and anything else printed as text.
func (r redactingHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, r.redact(v.String()))
	case slog.KindGroup:
		group := v.Group()
		clean := make([]any, len(group))
		for i, g := range group {
			clean[i] = r.attr(g)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, r.redact(err.Error()))
		}
		return slog.String(a.Key, r.redact(v.String()))
	}
	return slog.Attr{Key: a.Key, Value: v}
}
