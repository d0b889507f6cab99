package runtime

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/stages"
)

// Sources of kinds generate, file and stdin produce messages into their output topic through the
// runner's batched producer. One process at a time runs a generate or file source (it holds the
// source's lease until it exits); a stdin source runs in the process whose input it reads. A source
// that is restarted starts from its beginning again: its messages may then arrive twice, as
// at-least-once delivery allows.

// producingSource is a source that produces messages.
type producingSource struct {
	node     *node
	output   *flow.Topic
	finite   bool
	total    int64  // messages it will produce, when it can tell (a generate source's count)
	leaseKey string // "" when every process runs the source (stdin)
	produce  func(ctx context.Context, e *emitter) error
	spread   roundRobin
	done     atomic.Bool
}

func (r *runner) newProducingSource(n *node, s *flow.Source) (*producingSource, error) {
	p := &producingSource{node: n, output: s.Output, finite: true, leaseKey: r.keys.SourceLease(s.Name)}
	switch s.Kind {
	case "generate":
		p.finite = s.Config.Has("count")
		p.total = s.Config.Int("count")
		p.produce = generate(s.Config.Int("count"), p.finite, s.Config.Float("rate"), s.Config.Fields("template"))
	case "file":
		path := s.Config.String("path")
		p.produce = func(ctx context.Context, e *emitter) error {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			return readJSONLines(ctx, f, path, e)
		}
	case "stdin":
		p.leaseKey = ""
		p.produce = func(ctx context.Context, e *emitter) error {
			return readJSONLines(ctx, r.opts.Stdin, "stdin", e)
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
	err := p.produce(sctx, &emitter{r: r, src: p})
	if flushErr := r.producer.Flush(r.hard); err == nil {
		err = flushErr
	}
	switch {
	case err == nil:
		p.done.Store(true)
		r.log.Info("source finished", "source", p.node.name, "messages", p.node.stats.out.Load())
	case sctx.Err() != nil && ctx.Err() == nil:
		r.log.Warn("source lease lost; another process runs the source now", "source", p.node.name)
	case ctx.Err() == nil:
		r.fail(fmt.Errorf("source %s: %w", p.node.name, err))
	}
}

// emitter writes what a source produces: messages to the output topic, rejects to the source's
// dead-letter stream.
type emitter struct {
	r   *runner
	src *producingSource
}

func (e *emitter) emit(ctx context.Context, m stages.Message) error {
	n := e.src.node
	n.stats.in.Add(1)
	span, tc := e.r.tracing.startSend(ctx, n, e.src.output.Name)
	if span != nil {
		defer span.End()
	}
	out, err := e.r.topicOutput(n, &message{out: tc}, e.src.output, &m, 0, e.src.spread.next())
	if err != nil {
		if !stages.IsPermanent(err) {
			return err
		}
		return e.reject(ctx, err, m)
	}
	n.stats.out.Add(1)
	return e.r.producer.Add(ctx, out.Stream, out.Entry)
}

// reject dead-letters a message the source cannot pass on, such as a line that is not JSON.
func (e *emitter) reject(ctx context.Context, err error, m stages.Message) error {
	n := e.src.node
	n.stats.failed.Add(1)
	e.r.log.Warn("source rejected a message", "source", n.name, "err", err)
	out := e.r.deadLetterMessage(n, &message{msg: m}, err, 1, time.Now())
	return e.r.producer.Add(ctx, out.Stream, out.Entry)
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
			m := stages.Message{Value: value}
			var err error
			if failed != nil {
				err = e.reject(ctx, failed, stages.Message{Value: map[string]any{"index": i}})
			} else {
				err = e.emit(ctx, m)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// readJSONLines produces a message per line of JSON; blank lines are skipped, and a line that is not
// a JSON object is dead-lettered with its line number. Lines are read in a goroutine of their own so
// that a stop does not wait for input that may never come (a terminal); that goroutine ends when the
// input does.
func readJSONLines(ctx context.Context, in io.Reader, name string, e *emitter) error {
	type line struct {
		text []byte
		err  error
	}
	lines := make(chan line, 256)
	go func() {
		defer close(lines)
		br := bufio.NewReaderSize(in, 64<<10)
		for {
			text, err := br.ReadBytes('\n')
			select {
			case lines <- line{text, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for n := 1; ; n++ {
		var l line
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l = <-lines:
		}
		if payload := bytes.TrimSpace(l.text); len(payload) > 0 {
			var err error
			if _, perr := stages.DecodePayload(payload); perr != nil {
				err = e.reject(ctx, fmt.Errorf("%s:%d: %w", name, n, perr),
					stages.Message{Value: map[string]any{"line": string(payload)}})
			} else {
				err = e.emit(ctx, stages.NewMessage("", payload, nil))
			}
			if err != nil {
				return err
			}
		}
		if errors.Is(l.err, io.EOF) {
			return nil
		}
		if l.err != nil {
			return fmt.Errorf("reading %s: %w", name, l.err)
		}
	}
}
