package runtime

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A node is a source, stage or sink of the plan as this process runs it. Nodes that consume (stages,
// sinks and redis_stream sources) work partition by partition through units; sources that produce
// (generate, file, stdin) run once in one process.
type node struct {
	name string
	typ  string // "source", "stage" or "sink"
	kind string

	group    string      // consumer group on the input streams
	input    *flow.Topic // nil for a redis_stream source, which reads an external stream
	handler  handler
	process  messageFunc // the handler inside the node's layers (layers.go)
	ordering flow.Ordering
	lanes    int // messages of one partition in flight at once
	// readCount is the most entries a read takes: Options.BatchSize, or less for a node that writes
	// to a topic with a smaller max_lag.
	readCount int64
	inline    bool // process in the reading goroutine: the kind only computes
	stateful  bool // the kind keeps per-key state (keyed_state.go)
	// timers is the processor of a stateful stage whose kind has timers (timers.go); nil otherwise.
	timers stages.TimerHandler
	// fireAtEnd: the kind's timers all fire once a job's inputs are drained (StatefulStage.FireAtEnd).
	fireAtEnd bool
	// prefetch names the state keys of a batch's messages, to read them in one round trip
	// (stages.StatePrefetcher); nil for kinds that cannot tell.
	prefetch stages.StatePrefetcher
	// outputWatermark says what the watermark of a kind's results is (stages.OutputWatermarker);
	// nil for kinds that pass on the messages they read.
	outputWatermark stages.OutputWatermarker
	// stage and source are the node's block in the plan: a stage's, or a source's that reads a
	// stream; nil otherwise.
	stage  *flow.Stage
	source *flow.Source
	retry  flow.RetryPolicy
	// transientRetry is the policy for transient failures: retry's, when the node has a retry
	// block, else flow.DefaultTransientRetry (no limit).
	transientRetry flow.RetryPolicy
	breaker        *breaker
	// retryInPlace makes failed messages wait for their retries in the process; otherwise delays
	// longer than Options.RetryInPlaceUpTo wait in the unit's retry set in Redis.
	retryInPlace bool
	timeout      time.Duration
	claimIdle    time.Duration // see claimIdle
	deadLetter   *flow.Topic   // nil: the node's own dead-letter stream
	delivery     flow.Delivery

	spanName string // see processSpan
	// startsTraces is set when the node reads what comes from outside the pipeline (its input
	// topic is written by no node of the plan): it starts a trace for a message without trace
	// context. Elsewhere such a message belongs to a trace that was not sampled.
	startsTraces bool
	// chain is the fused chain the node runs in (fusion.go); nil when it runs in a hop of its own.
	chain *chain
	// resumeAs, for a stage after the first of a chain, names it in the retries it parks in the
	// chain's retry set, where the next attempt starts; "" elsewhere.
	resumeAs    string
	stats       nodeStats
	metricAttrs metric.MeasurementOption // the node's attributes on its metrics

	log             *slog.Logger // the runner's, with the node's name
	backpressureLog sync.Once    // the first wait at a capped topic is logged
}

// handler does a node's work on one message.
type handler interface {
	// handle processes m and appends the entries to write for it to outs. An error marked
	// stages.Permanent is not retried.
	handle(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error)
	// flush makes what handle delivered durable; it runs before a batch is acknowledged.
	flush(ctx context.Context) error
	// open and close bracket the run (a file sink opens its file).
	open(ctx context.Context) error
	close() error
}

// lifecycle is the open, flush and close of a handler whose kind implements them (the optional
// stages.Opener, stages.Flusher and io.Closer).
type lifecycle struct{ impl any }

func (l lifecycle) open(ctx context.Context) error {
	if o, ok := l.impl.(stages.Opener); ok {
		return o.Open(ctx)
	}
	return nil
}

func (l lifecycle) flush(ctx context.Context) error {
	if f, ok := l.impl.(stages.Flusher); ok {
		return f.Flush(ctx)
	}
	return nil
}

func (l lifecycle) close() error {
	if c, ok := l.impl.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// noLifecycle is the open, close and flush of handlers without resources.
type noLifecycle struct{}

func (noLifecycle) open(context.Context) error  { return nil }
func (noLifecycle) close() error                { return nil }
func (noLifecycle) flush(context.Context) error { return nil }

func (n *node) open(ctx context.Context) error {
	if n.handler == nil {
		return nil
	}
	return n.handler.open(ctx)
}

func (n *node) close() error {
	if n.handler == nil {
		return nil
	}
	return n.handler.close()
}

// message is one input entry while a node works on it.
type message struct {
	id string
	// path tells apart the messages that the stages of a fused chain made of the entry id: the
	// index of the message among its siblings at each stage that made more than one ("" for an
	// entry read from a stream). With id, it identifies an effectively-once output.
	path      string
	partition int
	msg       stages.Message
	// inKey and inPayload are the entry's key and payload as read, for keptKey.
	inKey      string
	inPayload  []byte
	trace      traceContext // the trace context the message arrived with
	out        traceContext // the trace context its outputs carry: its processing span's
	deliveries int64        // from a reclaim; 0 when unknown
	// attempts were already made at this message: by earlier deliveries, or before it waited in
	// the retry set (retry, which it leaves once handled).
	attempts     int
	firstFailure time.Time
	retry        *redis.Retry
	state        *state.Batch // its batch's state writes, for a stateful node
	watermark    int64        // a stateful node's watermark as of the message, in Unix ms
	// outcome is what its handler said became of it when it wrote nothing (outcomes.go).
	outcome outcome
	// batched: a sink that takes batches made its first attempt with its batch, which came to
	// batchErr (sinkHandler.deliverBatch); its first attempt takes that result.
	batched  bool
	batchErr error
	// away, for a message of such a batch that failed transiently, is the batch's messages that
	// wait with it, at awayAt: once one of them is delivered, those after it go as a batch again.
	away   *sinkBatch
	awayAt int
}

// heldBack and released make a node the waiter of its writes at a capped topic's gate.
func (n *node) heldBack(g *partitionGate) {
	n.stats.heldBy.Store(&g.topic)
	if n.stats.holding.Add(1) == 1 {
		n.backpressureLog.Do(func() {
			n.log.Info("held back: a topic it writes has reached its max_lag; it goes on as the topic's readers catch up",
				"topic", g.topic, "partition", g.partition, "max_lag", g.limit)
		})
	}
}

func (n *node) released(_ *partitionGate, waited time.Duration) {
	n.stats.heldBack.Add(int64(waited))
	n.stats.holding.Add(-1)
}

// unit is one partition of a consuming node: the unit of work that processes share.
type unit struct {
	node      *node
	partition int
	stream    string // the input stream
	leaseKey  string // "" when the unit needs no lease (ordering = "none")
	// retryKey is the unit's retry set, where failed messages wait for their next attempt and
	// replayed dead letters for theirs; "" for sources, whose failures cannot be retried.
	retryKey string
	// startLatest makes a new consumer group start at the end of the stream (a redis_stream source
	// with start = "latest") instead of its beginning.
	startLatest bool
}

// addUnits adds a unit per partition of the node's input.
func (r *runner) addUnits(n *node) {
	for p := 0; p < n.input.Partitions; p++ {
		u := &unit{node: n, partition: p, stream: r.keys.Stream(n.input.Name, p), retryKey: r.keys.Retry(n.input.Name, p, n.name)}
		if n.ordering != flow.OrderNone {
			u.leaseKey = r.keys.Lease(n.input.Name, p, n.name)
		}
		r.units = append(r.units, u)
	}
}

func (r *runner) addStage(s *flow.Stage) error {
	kind, err := stages.StageKindOf(s)
	if err != nil {
		return &ConfigError{err.Error()}
	}
	traits := kind.TraitsFor(s.Config)
	n := &node{
		name: s.Name, typ: "stage", kind: s.Kind, stage: s,
		group: redis.Group(s.Name), input: s.Input,
		ordering: s.Ordering, lanes: s.Concurrency, inline: traits.Inline, stateful: traits.Stateful,
		retry: s.Retry, retryInPlace: s.RetryInPlace, timeout: s.Timeout, deadLetter: s.DeadLetter, delivery: s.Delivery,
	}
	// A stateful stage's retries wait in place, and so do those of a stage that feeds one: a
	// message parked in the retry set while the messages behind it went on would let them move the
	// watermark past its windows, and it would come back late. Its partition waits for it instead.
	n.retryInPlace = n.retryInPlace || s.Watermark != nil
	if n.stateful && n.ordering == flow.OrderNone {
		return &ConfigError{"stage " + s.Name + ": a " + s.Kind + " stage keeps state per partition, which needs ordering = \"key\" or \"partition\", not \"none\""}
	}
	n.log = r.log.With(n.typ, n.name)
	env := r.env(n)
	h := &stageHandler{r: r, node: n, keepsKey: keyClaimOf(s, traits)}
	var impl any
	if n.stateful {
		compiled, err := stages.CompileStateful(s, env)
		if err != nil {
			return &ConfigError{err.Error()}
		}
		h.stateful, impl = compiled.Processor, compiled.Processor
		n.timers, n.fireAtEnd = compiled.TimerHandler, compiled.FireAtEnd
		n.prefetch, n.outputWatermark = compiled.StatePrefetcher, compiled.OutputWatermarker
	} else {
		if h.proc, err = stages.Compile(s, env); err != nil {
			return &ConfigError{err.Error()}
		}
		impl = h.proc
	}
	h.lifecycle = lifecycle{impl}
	n.handler = h
	r.nodes = append(r.nodes, n)
	if !s.FusedAfter() || r.opts.NoFusion {
		r.addUnits(n) // a stage fused after another gets units only if its link runs as a stream (fuseChains)
	}
	return nil
}

// kindMeter is the meter of the kinds' own metrics.
func (r *runner) kindMeter() metric.Meter {
	if r.opts.MeterProvider == nil {
		return noop.NewMeterProvider().Meter("")
	}
	return r.opts.MeterProvider.Meter("github.com/flowrun/flowrun/stages")
}

// stdout returns the runner's standard output, shared by its stdout sinks.
func (r *runner) stdout() *stages.LineWriter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		r.out = stages.NewLineWriter(r.opts.Stdout, 4<<10)
	}
	return r.out
}

// env is what the kinds' constructors get for node n.
func (r *runner) env(n *node) stages.Env {
	env := stages.Env{
		Pipeline: r.plan.Name, Node: n.name, Logger: n.log, Clock: r.clock,
		Meter: r.kindMeter(), HTTPClient: r.opts.HTTPClient, Stdin: r.opts.Stdin, Stdout: r.stdout(),
		MaxMessageSize: r.maxMessageSize(), Redact: r.plan.Redact, Functions: stages.Lookup,
	}
	if r.opts.NodeEnv != nil {
		r.opts.NodeEnv(n.typ, n.name, &env)
	}
	return env
}

func (r *runner) addSource(s *flow.Source) error {
	kind, err := stages.SourceKindOf(s)
	if err != nil {
		return &ConfigError{err.Error()}
	}
	n := &node{name: s.Name, typ: "source", kind: s.Kind, retry: flow.DefaultRetry, timeout: stages.DefaultSinkTimeout,
		delivery: r.plan.Delivery}
	n.log = r.log.With(n.typ, n.name)
	r.nodes = append(r.nodes, n)
	if kind.Stream != nil {
		r.addStreamSource(n, s, kind.Stream(s))
		return nil
	}
	p, err := r.newProducingSource(n, s, kind)
	if err != nil {
		return err
	}
	r.producers = append(r.producers, p)
	return nil
}
