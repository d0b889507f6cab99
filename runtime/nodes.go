package runtime

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/backpressure"
	"github.com/flowrun/flowrun/stages"
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
	maxRead   int64 // the kind's bound on readCount (StageTraits.MaxRead); 0: none
	inline    bool  // process in the reading goroutine: the kind only computes
	stateful  bool  // the kind keeps per-key state (keyed_state.go)
	// timers is the processor of a stateful stage whose kind has timers (timers.go); nil otherwise.
	timers stages.TimerHandler
	// fireAtEnd: the kind's timers all fire once a job's inputs are drained (StatefulStage.FireAtEnd).
	fireAtEnd bool
	// tableTime, for a kind whose timers follow a table's watermark (StatefulStage.TableTime),
	// reads it; nil otherwise.
	tableTime *tableClock
	// absorbs: what the kind passes nothing on of it took into its state (StatefulStage.Absorbs).
	absorbs bool
	// prefetch names the state keys of a batch's messages, to read them in one round trip
	// (stages.StatePrefetcher); nil for kinds that cannot tell.
	prefetch stages.StatePrefetcher
	// packsKeys: the stage's keys are packed, and its workers keep them all (state.PackedKeys).
	packsKeys bool
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
	// catchUp is the wait of a stage that looks a table up for the table to catch up (tables.go);
	// nil for other nodes.
	catchUp *tableCatchUp
	// chain is the fused chain the node runs in (fusion.go); nil when it runs in a hop of its own.
	chain *chain
	// resumeAs, for a stage after the first of a chain, names it in the retries it parks in the
	// chain's retry set, where the next attempt starts; "" elsewhere.
	resumeAs string
	stats    nodeStats
	// reads share the memory of the node's reads among the units this process runs (readshare.go).
	reads       readShares
	metricAttrs metric.MeasurementOption // the node's attributes on its metrics
	recordAttrs []metric.RecordOption    // the same, as the options of a histogram's record

	log             *slog.Logger // the runner's, with the node's name
	backpressureLog sync.Once    // the first wait at a capped topic is logged
}

// outputsPer is room for the outputs of n messages: one each, most stages write, but none for a
// sink, whose outputs are at most a rare dead letter (a sink's batch of Outputs, zeroed and
// never used, was a tenth of the bytes a pass-through job allocated), nor for a stage whose
// outputs are results its timers write (an aggregate's windows), not the messages it read.
func (n *node) outputsPer(messages int) int {
	if n.typ == "sink" || n.stage != nil && n.stage.Spec != nil && n.stage.Spec.Results {
		return 0
	}
	return messages
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

// HeldBack and Released make a node the waiter of its writes at a capped topic's gate
// (backpressure.Waiter).
func (n *node) HeldBack(g *backpressure.Gate) {
	topic := g.Topic()
	n.stats.heldBy.Store(&topic)
	if n.stats.holding.Add(1) == 1 {
		n.backpressureLog.Do(func() {
			n.log.Info("held back: a topic it writes has reached its max_lag; it goes on as the topic's readers catch up",
				"topic", g.Topic(), "partition", g.Partition(), "max_lag", g.Limit())
		})
	}
}

func (n *node) Released(_ *backpressure.Gate, waited time.Duration) {
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

// chain is a fused chain as this process runs it.
type chain struct {
	name  string
	nodes []*node       // in order; nodes[0] owns the units
	steps []messageFunc // each node's own layers (nodes[0].process is the chain's)
	// head keeps the settings of the first node that the chain changed, to undo it (unchain).
	head struct {
		inline    bool
		lanes     int
		readCount int64
	}
}

// index returns the position of the named stage in the chain, or -1.
func (c *chain) index(stage string) int {
	for i, n := range c.nodes {
		if n.name == stage {
			return i
		}
	}
	return -1
}

// inputName names the node's input in dedup markers: its topic, or for a source the source itself.
func (n *node) inputName() string {
	if n.input != nil {
		return n.input.Name
	}
	return n.name
}

// processSpan names a node's processing spans, "process <input>" (made once, in newRunner).
func (n *node) processSpan() string { return n.spanName }
