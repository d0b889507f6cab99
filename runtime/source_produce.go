package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/backpressure"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Producing sources (a stages.Source: the generate, file and stdin kinds) produce messages into their
// output topic. One process at a time runs such a source (it holds the source's lease until it
// exits), unless its kind is Shared: then every process runs its own (stdin).
//
// A source never loses a message to Redis: it hands what it produces to a writer (source_write.go)
// that writes it in batches and, while Redis fails, waits and writes the same batch again, and the
// source counts a message as produced only once Redis has it. The source is held back meanwhile.
//
// A source whose kind Resumes (file) records its position with every batch (a checkpoint, in the
// same transaction on a single server), so that a restarted process resumes after the last message
// written; others start from their first message again.

// sourceRun is what the producing sources, their writers (source_write.go) and their watermarks
// (source_time.go) need of the run: the per-message path (to make their entries and dead
// letters), the run's failures, the client and plan, the options, the backpressure gates, the
// dedup markers' TTL, and a job's end (closing, closeSources, kickDrain). The runner makes one.
type sourceRun struct {
	*processing
	*failures
	log          *slog.Logger // the runner's
	rdb          *redis.Client
	plan         *flow.Plan
	opts         *Options
	backpressure *backpressure.Gates
	dedupTTL     *time.Duration // the runner's, set once its nodes are configured
	closing      *atomic.Bool   // the runner's: a job's inputs are drained
	closeSources chan struct{}  // closed with closing
	kickDrain    func()         // wakes a job's end test
}

// maxMessageSize is the largest entry the pipeline takes (max_message_size).
func (r *sourceRun) maxMessageSize() int64 { return maxMessageSize(r.plan) }

// producingSource is a source that produces messages.
type producingSource struct {
	node     *node
	output   *flow.Topic
	impl     stages.Source
	finite   bool
	total    int64  // messages it will produce, when it can tell; 0 when it cannot
	leaseKey string // "" when every process runs the source (a Shared kind)
	// positionKey is where a resuming source's checkpoint lives; "" for sources that keep none.
	positionKey string
	spread      sourceSpread
	// time is the source's watermarks, when its topic feeds a stateful stage (source_time.go).
	time      *sourceTime
	done      atomic.Bool
	unwritten atomic.Int64 // entries produced and not yet written (nor dropped by a stop)
	// upstreamLag is what the source last reported of its upstream system's lag (ReportLag); -1
	// until it reports one.
	upstreamLag atomic.Int64
}

func (r *sourceRun) newProducingSource(n *node, s *flow.Source, kind stages.SourceKind, env stages.Env) (*producingSource, error) {
	p := &producingSource{node: n, output: s.Output, finite: true}
	p.upstreamLag.Store(-1)
	if kind.Traits.Finite != nil {
		var total int64
		p.finite, total = kind.Traits.Finite(s.Config)
		p.total = max(total, 0)
	}
	if !kind.Traits.Shared {
		p.leaseKey = r.keys.SourceLease(s.Name)
	}
	if kind.Traits.Resumes {
		p.positionKey = r.keys.SourcePosition(s.Name)
	}
	impl, err := kind.New(s, env)
	if err != nil {
		return nil, &ConfigError{"source " + s.Name + ": " + err.Error()}
	}
	if r.opts.WrapSource != nil {
		impl = r.opts.WrapSource(s.Name, impl)
	}
	p.impl = impl
	p.time = r.newSourceTime(p)
	return p, nil
}

// outputsOf lists the output topics of producing sources, in their order.
func outputsOf(producers []*producingSource) []*flow.Topic {
	out := make([]*flow.Topic, len(producers))
	for i, p := range producers {
		out[i] = p.output
	}
	return out
}

// runProducer runs a producing source to its end, once it holds the source's lease. A process that
// loses the lease to another waits to take it back (when that one stops or dies) and runs the
// source again from there: a resuming source from its checkpoint, others from their first message.
func (r *sourceRun) runProducer(ctx context.Context, own *ownership, p *producingSource) {
	for {
		sctx := ctx
		if p.leaseKey != "" {
			var ok bool
			if sctx, ok = own.holdSource(ctx, p.leaseKey); !ok {
				return
			}
		}
		waitTime := r.runSourceTime(sctx, p)
		err := r.produce(sctx, own, p)
		switch {
		case err == nil:
			p.done.Store(true)
			r.kickDrain()
			c := p.node.stats.counts()
			r.log.Info("source finished", "source", p.node.name, "messages", c.out, "rejected", c.deadLettered)
		case errors.Is(err, errSourceLeaseLost), sctx.Err() != nil && ctx.Err() == nil:
			r.log.Warn("source lease lost; another process runs the source now", "source", p.node.name)
			if ctx.Err() == nil && p.leaseKey != "" {
				own.dropSource(ctx, p.leaseKey)
				waitTime()
				continue
			}
		case ctx.Err() == nil || !errors.Is(err, context.Canceled):
			r.fail(fmt.Errorf("source %s: %w", p.node.name, err))
		}
		waitTime()
		return
	}
}

// runSourceTime moves a source's watermarks while it is idle, and closes them at a job's end, as
// long as this process holds the source (until sctx ends). It returns a function that waits for
// that to end.
func (r *sourceRun) runSourceTime(sctx context.Context, p *producingSource) (wait func()) {
	if p.time == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() { defer close(done); p.time.run(sctx) }()
	return func() { <-done }
}

// produce runs a producing source until it ends, fails or loses its lease.
func (r *sourceRun) produce(sctx context.Context, own *ownership, p *producingSource) error {
	w := r.startSourceWriter(sctx, p, own)
	e := &emitter{r: r, src: p, w: w}
	defer p.upstreamLag.Store(-1) // what it reported is no longer this process's to show
	kind := lifecycle{p.impl}
	err := kind.open(sctx)
	if err == nil {
		err = p.impl.Produce(sctx, e)
	}
	if werr := w.close(); werr != nil && (err == nil || errors.Is(err, errWriterStopped)) {
		err = werr
	}
	if cerr := kind.close(); cerr != nil {
		r.log.Error("closing", "source", p.node.name, "err", cerr)
	}
	return err
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

// emitter is the stages.Emitter of a producing source: it turns what the source produces into
// entries for its writer, messages for the output topic and rejects for the source's dead-letter
// stream.
type emitter struct {
	r   *sourceRun
	src *producingSource
	w   *sourceWriter
}

func (e *emitter) Emit(ctx context.Context, m stages.Message, at stages.Origin) error {
	it, span, err := e.item(ctx, &m, at)
	if span != nil {
		defer span.End()
	}
	if err != nil {
		if !stages.IsPermanent(err) {
			return err
		}
		return e.Reject(ctx, err, m, at)
	}
	return e.w.add(ctx, it)
}

// item makes the entry of a message for the source's topic, under the producer span it starts
// (nil when the message is not traced), which the caller ends. A permanent error is about the
// message: it cannot be passed on.
func (e *emitter) item(ctx context.Context, m *stages.Message, at stages.Origin) (sourceItem, trace.Span, error) {
	n := e.src.node
	span, tc := e.r.tracing.startSend(ctx, n, e.src.output.Name)
	out, err := e.r.topicOutput(n, &message{id: at.ID, out: tc}, e.src.output, m, 0, e.src.spread.next(at.ID))
	if err == nil {
		if size, limit := redis.EntrySize(out.Entry), e.r.maxMessageSize(); size > limit {
			err = stages.Permanent(fmt.Errorf("the message's entry is %d bytes, more than max_message_size (%d bytes)", size, limit))
		}
	}
	if err != nil {
		return sourceItem{}, span, err
	}
	it := sourceItem{out: out, position: at.Position}
	if e.src.time != nil {
		it.times = e.src.time.measure(m)
	}
	return it, span, nil
}

// EmitAll queues the messages as one group, which the writer writes in one batch, and waits until
// it is written (see stages.Emitter). It refuses at once, queueing nothing, while Redis is failing
// or a partition the messages go to is at its max_lag: a source that answers clients has them come
// back later instead of holding them.
func (e *emitter) EmitAll(ctx context.Context, ms []stages.Message, at []stages.Origin) ([]string, error) {
	if len(ms) != len(at) {
		return nil, fmt.Errorf("EmitAll: %d messages and %d origins", len(ms), len(at))
	}
	if len(ms) == 0 {
		return nil, nil
	}
	if _, failing := e.r.outage.Failing(); failing {
		return nil, stages.ErrUnavailable
	}
	g := newSourceGroup(len(ms))
	spans := make([]trace.Span, 0, len(ms))
	defer func() {
		for _, s := range spans {
			s.End()
		}
	}()
	for i := range ms {
		it, span, err := e.item(ctx, &ms[i], at[i])
		if span != nil {
			spans = append(spans, span)
		}
		if err != nil {
			if stages.IsPermanent(err) {
				err = &stages.EmitError{Index: i, Err: err}
			}
			return nil, err
		}
		it.group, it.index = g, i
		g.items[i] = it
	}
	if err := e.admit(ctx, g); err != nil {
		return nil, err
	}
	if err := e.w.addAll(ctx, g); err != nil {
		g.release()
		if errors.Is(err, errWriterStopped) {
			err = stages.ErrUnavailable
		}
		return nil, err
	}
	select {
	case <-g.written:
		return g.ids, nil
	case <-g.failed:
	case <-e.w.stopped:
	case <-ctx.Done():
	}
	select {
	case <-g.written: // written meanwhile
		return g.ids, nil
	default:
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, stages.ErrUnavailable
}

// admit lets a group's entries through the gates of their partitions, or none of them while one
// is at its topic's max_lag (stages.ErrTopicFull): it does not wait.
func (e *emitter) admit(ctx context.Context, g *sourceGroup) error {
	bp := e.r.backpressure
	var want map[*backpressure.Gate]int64
	for i := range g.items {
		if gate := bp.Gate(g.items[i].out.Stream); gate != nil {
			if want == nil {
				want = map[*backpressure.Gate]int64{}
			}
			want[gate]++
		}
	}
	admitted := make([]*backpressure.Gate, 0, len(want))
	undo := func() {
		for _, gate := range admitted {
			gate.Dropped(want[gate])
		}
	}
	for gate, n := range want {
		ok, err := bp.TryAdmit(ctx, gate, n)
		if err != nil || !ok {
			undo()
			if err == nil {
				err = stages.ErrTopicFull
			}
			return err
		}
		admitted = append(admitted, gate)
	}
	for i := range g.items {
		g.items[i].gate = bp.Gate(g.items[i].out.Stream)
	}
	return nil
}

// Reject dead-letters a message the source cannot pass on, such as a line that is not JSON, with
// where it came from.
func (e *emitter) Reject(ctx context.Context, reason error, m stages.Message, at stages.Origin) error {
	n := e.src.node
	now := e.r.clock.Now()
	env := Envelope{File: at.File, Line: at.Line}
	env.Error, env.Attempts, env.FirstFailedAt, env.LastFailedAt = e.r.plan.Redact(reason.Error()), 1, now, now
	env.Key, env.Headers = m.Key, m.Headers
	if payload, perr := m.Payload(); perr == nil && int64(len(payload)) > e.r.maxMessageSize()/2 {
		// Too large to go whole into a dead letter, which must stay under the limit too.
		env.RawFields = map[string]string{"payload_start": string(payload[:stages.LineStartKept])}
	} else if perr == nil && len(payload) > 0 {
		env.Payload = payload
	}
	out := e.r.deadLetter(n, 0, env, traceContext{})
	return e.w.add(ctx, sourceItem{out: out, rejected: true, position: at.Position})
}

// Record records the source's checkpoint before it emits anything, fenced by its lease, waiting
// while Redis is unreachable.
func (e *emitter) Record(ctx context.Context, position string) error {
	key := e.src.positionKey
	if key == "" {
		return nil
	}
	var b backoff
	for {
		args := redis.CommitArgs{Checkpoint: &redis.Checkpoint{Key: key, Value: position}}
		if e.src.leaseKey != "" {
			lease, ok := e.w.own.sourceLease(e.src.leaseKey)
			if !ok {
				return errSourceLeaseLost
			}
			args.Lease = &lease
		}
		_, err := e.r.rdb.Commit(ctx, args)
		switch {
		case err == nil:
			e.r.outage.OK()
			return nil
		case errors.Is(err, redis.ErrLeaseLost):
			if _, ok := e.w.own.retakeSource(ctx, e.src.leaseKey, *args.Lease); ok {
				continue
			}
			return errSourceLeaseLost
		case redis.Unrecoverable(err) || ctx.Err() != nil:
			return err
		}
		e.r.outage.Failed("source "+e.src.node.name+" recording its position", err)
		b.wait(ctx, e.r.clock, &e.r.jitter)
	}
}

// ReportLag keeps the source's latest upstream lag, for the metrics, inspect and the page.
func (e *emitter) ReportLag(n int64) { e.src.upstreamLag.Store(max(n, 0)) }

// Resume reads the source's checkpoint, waiting while Redis is unreachable.
func (e *emitter) Resume(ctx context.Context) (string, bool, error) {
	key := e.src.positionKey
	if key == "" {
		return "", false, nil
	}
	var b backoff
	for {
		raw, found, err := e.r.rdb.ReadCheckpoint(ctx, key)
		if err == nil {
			e.r.outage.OK()
			return raw, found, nil
		}
		if redis.Unrecoverable(err) || ctx.Err() != nil {
			return "", false, err
		}
		e.r.outage.Failed("source "+e.src.node.name+" reading its position", err)
		b.wait(ctx, e.r.clock, &e.r.jitter)
	}
}
