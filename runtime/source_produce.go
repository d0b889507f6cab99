package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Sources of kinds generate, file and stdin produce messages into their output topic. One process at
// a time runs a generate or file source (it holds the source's lease until it exits); a stdin source
// runs in the process whose input it reads.
//
// A source never loses a message to Redis: it hands what it produces to a writer (source_write.go)
// that writes it in batches and, while Redis fails, waits and writes the same batch again, and the
// source counts a message as produced only once Redis has it. The source is held back meanwhile.
//
// A file source records its position with every batch (a checkpoint, in the same transaction on a
// single server), so that a restarted process resumes after the last line written: see
// source_file.go. A restarted generate source starts from its first message again.

// producingSource is a source that produces messages.
type producingSource struct {
	node     *node
	output   *flow.Topic
	finite   bool
	total    int64  // messages it will produce, when it can tell (a generate source's count)
	leaseKey string // "" when every process runs the source (stdin)
	// positionKey is where a file source's checkpoint lives; "" for sources that keep none.
	positionKey string
	produce     func(ctx context.Context, e *emitter) error
	spread      roundRobin
	done        atomic.Bool
}

func (r *runner) newProducingSource(n *node, s *flow.Source) (*producingSource, error) {
	p := &producingSource{node: n, output: s.Output, finite: true, leaseKey: r.keys.SourceLease(s.Name)}
	switch s.Kind {
	case "generate":
		p.finite = s.Config.Has("count")
		p.total = s.Config.Int("count")
		p.produce = generate(s.Config.Int("count"), p.finite, s.Config.Float("rate"), s.Config.Fields("template"))
	case "file":
		p.positionKey = r.keys.SourcePosition(s.Name)
		p.produce = r.readFile(p, s.Config.String("path"))
	case "stdin":
		p.leaseKey = ""
		p.produce = func(ctx context.Context, e *emitter) error {
			return readJSONLines(ctx, r.opts.Stdin, lineReader{name: "stdin", maxSize: r.maxMessageSize()}, e)
		}
	default:
		return nil, &ConfigError{fmt.Sprintf("source %s: unknown kind %q", s.Name, s.Kind)}
	}
	return p, nil
}

// runProducer runs a producing source to its end, once it holds the source's lease.
func (r *runner) runProducer(ctx context.Context, own *ownership, p *producingSource) {
	sctx := ctx
	if p.leaseKey != "" {
		var ok bool
		if sctx, ok = own.holdSource(ctx, p.leaseKey); !ok {
			return
		}
	}
	w := r.startSourceWriter(sctx, p, own)
	e := &emitter{r: r, src: p, w: w, epoch: newEpoch()}
	err := p.produce(sctx, e)
	if werr := w.close(); werr != nil && (err == nil || errors.Is(err, errWriterStopped)) {
		err = werr
	}
	switch {
	case err == nil:
		p.done.Store(true)
		r.log.Info("source finished", "source", p.node.name, "messages", p.node.stats.out.Load())
	case errors.Is(err, errSourceLeaseLost), sctx.Err() != nil && ctx.Err() == nil:
		r.log.Warn("source lease lost; another process runs the source now", "source", p.node.name)
	case ctx.Err() == nil || !errors.Is(err, context.Canceled):
		r.fail(fmt.Errorf("source %s: %w", p.node.name, err))
	}
}

// onRestart says what happens to messages a stop could not write.
func (p *producingSource) onRestart() string {
	switch {
	case p.positionKey != "":
		return "which the source reads again when it next starts"
	case p.leaseKey == "":
		return "which are lost: standard input cannot be read again"
	}
	return "which the source produces again when it next starts from its first message"
}

// newEpoch returns a random name for one run of a source from its beginning: the effectively-once
// markers of its messages carry it, so that a source that starts again from scratch is not taken
// for a repetition of its earlier run.
func newEpoch() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail on supported platforms
	return hex.EncodeToString(b[:])
}

// emitter turns what a source produces into entries for its writer: messages for the output
// topic, rejects for the source's dead-letter stream.
type emitter struct {
	r     *runner
	src   *producingSource
	w     *sourceWriter
	epoch string // see newEpoch; a file source resuming keeps its checkpoint's
}

// origin is where a message came from: its number in the source (a line number, or a generated
// message's index), and what a file source records as its position once it is written.
type origin struct {
	seq      int64
	position string
}

// id names a message in the effectively-once markers of its outputs.
func (e *emitter) id(o origin) string { return e.epoch + ":" + itoa(o.seq) }

func (e *emitter) emit(ctx context.Context, m stages.Message, o origin) error {
	n := e.src.node
	n.stats.in.Add(1)
	span, tc := e.r.tracing.startSend(ctx, n, e.src.output.Name)
	if span != nil {
		defer span.End()
	}
	out, err := e.r.topicOutput(n, &message{id: e.id(o), out: tc}, e.src.output, &m, 0, e.src.spread.next())
	if err == nil {
		if size, limit := redis.EntrySize(out.Entry), e.r.maxMessageSize(); size > limit {
			err = stages.Permanent(fmt.Errorf("the message's entry is %d bytes, more than max_message_size (%d bytes)", size, limit))
		}
	}
	if err != nil {
		if !stages.IsPermanent(err) {
			return err
		}
		return e.reject(ctx, err, m, o, Envelope{})
	}
	return e.w.add(ctx, sourceItem{out: out, position: o.position})
}

// reject dead-letters a message the source cannot pass on, such as a line that is not JSON; env
// holds what the caller knows of where it came from (a file and line).
func (e *emitter) reject(ctx context.Context, err error, m stages.Message, o origin, env Envelope) error {
	n := e.src.node
	n.stats.failed.Add(1)
	now := time.Now()
	env.Error, env.Attempts, env.FirstFailedAt, env.LastFailedAt = e.r.plan.Redact(err.Error()), 1, now, now
	env.Key, env.Headers = m.Key, m.Headers
	if payload, perr := m.Payload(); perr == nil && int64(len(payload)) > e.r.maxMessageSize()/2 {
		// Too large to go whole into a dead letter, which must stay under the limit too.
		env.RawFields = map[string]string{"payload_start": string(payload[:lineStartKept])}
	} else if perr == nil && len(payload) > 0 {
		env.Payload = payload
	}
	out := e.r.deadLetter(n, 0, env, traceContext{})
	return e.w.add(ctx, sourceItem{out: out, rejected: true, position: o.position})
}

// generate produces count messages (or endless ones) from a template, at most rate per second.
func generate(count int64, finite bool, rate float64, template []flow.Field) func(context.Context, *emitter) error {
	return func(ctx context.Context, e *emitter) error {
		start := time.Now()
		timer := time.NewTimer(0)
		defer timer.Stop()
		for i := int64(0); !finite || i < count; i++ {
			if rate > 0 {
				if wait := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); wait > 0 {
					timer.Reset(wait)
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-timer.C:
					}
				}
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			env := expr.Env{Index: i}
			value := make(map[string]any, len(template))
			var failed error
			for _, f := range template {
				v, err := f.Expr.Eval(&env)
				if err != nil {
					failed = stages.Permanent(fmt.Errorf("template field %s of message %d: %w", f.Name, i, err))
					break
				}
				value[f.Name] = v.Interface()
			}
			var err error
			if failed != nil {
				err = e.reject(ctx, failed, stages.Message{Value: map[string]any{"index": i}}, origin{seq: i}, Envelope{})
			} else {
				err = e.emit(ctx, stages.Message{Value: value}, origin{seq: i})
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}
