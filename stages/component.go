package stages

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// The contracts between a kind and the runtime that runs it. A kind's constructor gets an Env and
// returns a Source, a Processor or a Sink; the runtime calls it message by message and takes care
// of everything around it (reading, batching, retries, dead letters, acknowledgements, tracing).
//
// Lifecycles are optional interfaces, implemented where they apply, by sources, processors and
// sinks alike: Opener (called once before the first message, or before Produce), Flusher (before a
// batch is acknowledged: what Deliver did must then be durable) and io.Closer (once, when the run,
// or the source, ends).

// Processor is a compiled stage: it turns one input message into the messages it passes on.
type Processor interface {
	// Process appends the outputs of m to out and returns the extended slice, so that a caller can
	// reuse one slice for a whole batch. It may modify m. An error fails this attempt at m; an error
	// marked Permanent (an expression that cannot evaluate on this message, say) is not retried.
	Process(ctx context.Context, m *Message, out []Output) ([]Output, error)
}

// Sink delivers messages out of the pipeline.
type Sink interface {
	// Deliver delivers m. An error fails this attempt: Transient ones (the service is away) pause
	// the sink and are retried without limit by default, Permanent ones go to the dead letters at
	// once, others follow the sink's retry policy. A sink that writes to Redis appends what it
	// writes to out instead, and the runtime writes it in the same step that acknowledges the
	// batch (see Write).
	Deliver(ctx context.Context, m *Message, out []Write) ([]Write, error)
}

// BatchSink is implemented by sinks that deliver a read batch at once, such as in one database
// transaction. The runtime then calls DeliverBatch, never Deliver: with the messages of a batch that
// pass the sink's where, for their first attempt, and with a batch of one for each later attempt
// at a message that failed (its retries, one probe at a time while the sink is paused). The sink
// sets each Delivery's Err as Deliver would return it: a Permanent error dead-letters that message
// only, a Transient one pauses the sink, and a message whose first attempt failed transiently is
// attempted again on its own. A BatchSink writes nothing to Redis (it has no Writes).
type BatchSink interface {
	Sink
	DeliverBatch(ctx context.Context, batch []Delivery)
}

// Delivery is one message of a batch handed to a BatchSink, and what delivering it came to.
type Delivery struct {
	Message *Message
	// ID is the stream ID of the message's input entry, the same on every delivery of the entry:
	// what a sink that delivers effectively once remembers with what it wrote.
	ID string
	// Partition is the input partition the entry was read from.
	Partition int
	// Redelivered: the entry may have been delivered before, by an attempt that failed or by a
	// process that died before it acknowledged the entry. A sink that delivers effectively once to
	// a system without deduplication of its own checks, for these only, whether it wrote them.
	Redelivered bool
	// Traceparent and Tracestate are the message's W3C trace context, for a sink that passes it
	// on (Deliver's is TraceFrom its context); empty when the message is not traced.
	Traceparent, Tracestate string
	// Err is set by DeliverBatch: nil when the message was delivered.
	Err error
}

// Write is an entry a sink adds to a stream of its choosing, written atomically with the
// acknowledgement of the batch it came from (exactly once with delivery = "effectively_once").
type Write struct {
	Stream  string // the stream's key, used as it is
	MaxLen  int64  // caps the stream at about this many entries; 0: no cap
	Message *Message
}

// Source produces messages into the pipeline from outside.
type Source interface {
	// Produce produces messages through out until it is done (a finite source returns nil) or ctx
	// ends (it returns ctx's error). Any other error ends the run.
	Produce(ctx context.Context, out Emitter) error
}

// Emitter takes what a source produces. It writes messages in batches and, while Redis is
// unreachable or the output topic is full, holds the source back in Emit: a source never buffers
// on its own, and nothing it emitted is lost.
type Emitter interface {
	// Emit passes m on to the source's output topic.
	Emit(ctx context.Context, m Message, at Origin) error
	// EmitAll passes ms on to the source's output topic together, ms[i] named by at[i], and
	// returns the IDs of their entries, in order, once Redis has every one of them: for a source
	// that answers its own client only then (an HTTP request). The messages go in one batch of
	// the source's writer, which is one transaction on a single Redis server; and under
	// effectively-once delivery a message whose ID was written is not written again, and gets the
	// ID of the entry written first.
	//
	// Unlike Emit it does not hold the source back; it refuses instead, and the source tells its
	// client to come back later. Refused before anything is queued: a message that cannot be
	// passed on (an *EmitError, whose Err is Permanent: it names the message; nothing is
	// dead-lettered), ErrTopicFull while a partition the messages go to is at its topic's
	// max_lag, ErrUnavailable while Redis is failing. ErrUnavailable is also returned when an
	// attempt to write the messages failed, or the source's writer stopped, and ctx's error when
	// ctx ends first: then the messages may still be written, all of them on a single server,
	// later, as the writer tries again until Redis takes them (so a client repeats such a call
	// with the same IDs, which effectively-once delivery writes once).
	EmitAll(ctx context.Context, ms []Message, at []Origin) (ids []string, err error)
	// Reject dead-letters what cannot become a message (a line that is not JSON), with why.
	Reject(ctx context.Context, reason error, m Message, at Origin) error
	// Resume returns the position the source recorded with the last message written (Origin's
	// Position), and false when it has none. Only sources whose traits say Resumes record one.
	Resume(ctx context.Context) (position string, found bool, err error)
	// Record records a position before any message is emitted: a resuming source that starts
	// afresh records where it starts, with the IDs its messages will have (a new run's), so that a
	// process that dies after writing its first messages and before their position was recorded
	// (a cluster writes them first) is followed by one that makes the same IDs, which
	// effectively-once delivery then writes once.
	Record(ctx context.Context, position string) error
	// ReportLag records how many messages the source's upstream system still holds for it (a
	// Kafka consumer group's lag, a JetStream consumer's pending count, an AMQP queue's depth), as
	// the source last learned it; it never blocks, so call it as often as the number is known.
	// inspect, the metric flowrun.source.upstream_lag and the live page show the latest.
	ReportLag(n int64)
}

// Origin is where an emitted message comes from.
type Origin struct {
	// ID names the message within the source, the same on every attempt to produce it (such as
	// "<run>-<line number>"): effectively-once delivery drops a message whose ID was written.
	ID string
	// Position is what a resuming source records once this message (and those before it) are
	// written, returned by Resume after a restart; "" for sources that keep none.
	Position string
	// File and Line say where the message was read, for its dead letter; empty when not from a file.
	File string
	Line int64
}

// StreamSource is what a source kind that reads a Redis stream other applications write returns
// (SourceKind.Stream): the runtime reads the stream itself, through a consumer group, like a stage.
type StreamSource struct {
	Stream string // the stream's key, used as it is
	Group  string // the consumer group the source reads through
	// StartLatest makes a new consumer group start at the end of the stream instead of its start.
	StartLatest bool
}

// Opener is implemented by kinds that acquire something before their first message.
type Opener interface {
	Open(ctx context.Context) error
}

// Flusher is implemented by sinks that buffer: Flush makes what Deliver delivered durable, and runs
// before the batch is acknowledged. An error delivers the batch again.
type Flusher interface {
	Flush(ctx context.Context) error
}

// Timeouter is implemented by kinds whose attempts have a timeout of their own (an http sink's
// request timeout), in place of the block's or the runtime's.
type Timeouter interface {
	Timeout() time.Duration
}

// Env is what a kind's constructor gets from the runtime.
type Env struct {
	Pipeline string // the pipeline's name
	Node     string // the source's, stage's or sink's name
	Logger   *slog.Logger
	Clock    Clock
	Meter    metric.Meter
	// HTTPClient is the client for kinds that call HTTP services; its timeout is the kind's own.
	HTTPClient *http.Client
	// Stdin is the process's standard input; Stdout its standard output, shared by every kind that
	// writes to it so that lines never interleave.
	Stdin  io.Reader
	Stdout *LineWriter
	// MaxMessageSize is the pipeline's max_message_size in bytes: a source rejects larger messages.
	MaxMessageSize int64
	// Functions looks up the Go stage functions (stages.Register) by name; a test replaces some
	// with mocks. nil means Lookup.
	Functions func(name string) (Func, bool)
	// Tables are the pipeline's tables by name (flow.Table), as the lookup kind reads them: the
	// runtime sets it; a test may give a fake.
	Tables map[string]TableReader
	// Redact hides the pipeline's secrets (sensitive variables) in text, such as errors that may
	// quote a URL with a token in it.
	Redact func(string) string
	// RateLimiter takes turns from the node's rate limits, which every process that runs the
	// pipeline shares (kept in Redis, on the Clock's time); nil where the runtime offers none.
	RateLimiter RateLimiter
}

// RateLimiter takes turns from a node's rate limits, one per limited key (Env.RateLimiter).
type RateLimiter interface {
	// Take takes a turn for one message from the limit of key: 0 when the message may go now, or
	// how long to wait before asking again, having taken nothing. The limit lets Burst messages go
	// at once after a quiet spell, and then one every Interval.
	Take(ctx context.Context, key string, limit RateLimit) (wait time.Duration, err error)
}

// RateLimit is a rate limit as a RateLimiter applies it: one message every Interval, with bursts of
// up to Burst (at least 1).
type RateLimit struct {
	Interval time.Duration
	Burst    int64
}

// TableReader reads a table's rows (a table block, kept by its stage of kind flow.TableKind). Get
// returns the row of key as committed by the table's stage, from whichever partition of the table
// holds it, and false when the table has no row for key. It reads what is committed when it is
// called (processing time): a lookup sees the updates that the table's stage has committed by then.
// GetAsOf returns the row of key as it was at an event time, for a table with history: the
// version that began last at or before it, of those the table keeps (false when none, or when the
// key was deleted then). Of a table without versions it returns what Get does.
type TableReader interface {
	Get(ctx context.Context, key string) (row []byte, found bool, err error)
	// GetMany returns the rows of keys at once, each nil where the table has none: a round trip
	// per batch instead of one per key (BatchReader).
	GetMany(ctx context.Context, keys []string) (rows [][]byte, err error)
	GetAsOf(ctx context.Context, key string, at time.Time) (row []byte, found bool, err error)
}

// BatchReader is what a stateless processor that reads something from outside for each message (a
// lookup, its table's row) may implement, to read a whole batch's at once: before the runtime
// processes the messages of a batch that it read, it calls ReadBatch with them, and passes what
// ReadBatch returned to each Process call in its context, where Batched finds it. Process must
// still work without it, reading for itself: for a message that another stage fused before it
// made, a retry, or a batch whose ReadBatch failed. ReadBatch may decode the messages, and must
// not change them otherwise.
type BatchReader interface {
	ReadBatch(ctx context.Context, msgs []*Message) (any, error)
}

type batchedKey struct{}

// WithBatched returns ctx carrying what a BatchReader read for the batch of the message that
// Process is given.
func WithBatched(ctx context.Context, batched any) context.Context {
	return context.WithValue(ctx, batchedKey{}, batched)
}

// Batched returns what the processor's ReadBatch read for the batch of the message that Process
// is given, nil when there is none.
func Batched(ctx context.Context) any { return ctx.Value(batchedKey{}) }

// StatefulStage is a compiled stateful stage (StageTraits.Stateful), as its kind's NewStateful makes
// it: its processor, and each thing the runtime does with it besides Process, declared by setting
// it. The runtime asks nothing else of the processor (whose lifecycle, Opener and io.Closer, is a
// Processor's): a method that is not declared here is not called, so that what a stateful kind
// can do is written in one place. CompileStateful checks that the declarations hold together.
type StatefulStage struct {
	Processor StatefulProcessor
	// TimerHandler fires the stage's due timers; nil for a kind that sets none.
	TimerHandler TimerHandler
	// FireAtEnd makes every timer fire when a job's inputs are drained (flowrun run
	// --until-drained), whatever the watermark: windows close, so that a job's output is complete.
	// A kind whose timers forget (dedupe) leaves it unset. It needs a TimerHandler.
	FireAtEnd bool
	// Absorbs says that a message for which Process returns nothing was taken into the state (a
	// table's row), which the counters show as absorbed rather than filtered.
	Absorbs bool
	// StatePrefetcher names the state keys a batch's messages will read, to read them at once;
	// nil: Process's reads go one by one.
	StatePrefetcher StatePrefetcher
	// PacksKeys says that the partition's owner keeps the stage's keys and their values in memory,
	// and that a batch's commit writes the keys it set and deleted as one record (a field of the
	// state hash) rather than a field each: for a kind whose messages mostly bring new keys of small
	// values that it forgets in time (dedupe). The owner reads every record when it takes the
	// partition (docs/design/state.md). The state's own entries (KeyCountKey) stay fields.
	PacksKeys bool
	// OutputWatermarker says how late the stage's results can be, for a kind whose outputs are
	// results of its own (flow.Kind.Results, which it then sets too); nil for a kind that passes
	// on the messages it read, and with them its input's watermark.
	OutputWatermarker OutputWatermarker
	// TableTime names a table (flow.Table) whose watermark, rather than the stage's input's, makes
	// the stage's timers due: the least of the committed watermarks of the table's stage over its
	// partitions, later than any time once they have all closed at a job's end. The runtime keeps
	// the stage's input open while timers wait for it. A lookup with as_of answers its messages so,
	// once no update that the table has yet to read can change the answer.
	TableTime string
}

// StatefulProcessor is the processor of a stateful stage (StatefulStage): Process gets, with each
// message, the state of the message's input partition as this attempt sees it. Like a Processor's,
// it appends the outputs of m to out; an error fails the attempt, and its state writes with it.
// Like st, m is good for the call only: the runtime reuses a batch's messages for the next batch,
// so a kind keeps what it needs of a message in its state, not a pointer to it.
type StatefulProcessor interface {
	Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error)
}

// State is a stateful stage's per-key state, durable timers and watermark on one input partition,
// for one attempt at a message (or one timer): the runtime hands it to StatefulProcessor.Process and
// TimerHandler.OnTimer, and it is good for that call only. State lives in Redis, in the hash slot of
// the input partition, and moves with the partition's lease: nothing is restored when another
// process takes over.
//
// Reads see the partition's committed state with the batch's own earlier writes; writes are
// committed together with the acknowledgement of the batch's input entries, in one step fenced by
// the partition's lease, and are discarded with the attempt when it fails. So a crash at any point
// neither loses nor repeats a state change. Every call takes the context that Process got.
//
// Time in a stateful stage is event time: each message's time as the stage's event_time reads it
// (or the time its entry was first written). The partition's watermark says how far event time has
// got there: no message that is still to come is more than the stage's grace behind it (see
// docs/running.md). It never goes backwards, and it is persisted with the state. A timer is due once
// the watermark reaches it: the runtime then calls the kind's OnTimer (TimerHandler) in the batch
// that moved the watermark, and commits what it writes and outputs with that batch.
//
// Keys and timer names are the kind's own; the state hash's fields that begin with a NUL byte are
// flowrun's: the runtime's watermark, and KeyCountKey, where the aggregate and dedupe kinds count
// their keys.
type State interface {
	Get(ctx context.Context, key string) (value []byte, found bool, err error)
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
	SetTimer(ctx context.Context, name string, at time.Time) error
	CancelTimer(ctx context.Context, name string) error
	// Watermark returns the partition's watermark as of the message being processed (a message
	// from outside the pipeline moves it as it is read); the zero time before there is one.
	Watermark(ctx context.Context) (time.Time, error)
	// Hold keeps the watermark that the stage passes on to the readers of its results at or before
	// at, until Release: for a kind whose later results may carry an earlier time than its
	// OutputWatermarker says (an open session's start). Holds are state, committed with the batch.
	Hold(ctx context.Context, name string, at time.Time) error
	Release(ctx context.Context, name string) error
	// Record counts an outcome of the message (late, duplicate) for the stage's counters (the job
	// summary, metrics, flowrun test's metrics.NODE); like the writes, only if the attempt succeeds,
	// or fails for good (a late message dead-lettered counts as late).
	Record(o Outcome)
	// Partition is the input partition, for errors that name it.
	Partition() int
}

// TimerHandler is what a stateful kind that uses timers declares (StatefulStage.TimerHandler):
// OnTimer is called for each due timer, earliest first, with the state of the batch; the timer is
// cancelled unless OnTimer sets it again. An error keeps the timer, and the batch is processed
// again (a Permanent error drops the timer, and is logged).
type TimerHandler interface {
	OnTimer(ctx context.Context, st State, name string, at time.Time, out []Output) ([]Output, error)
}

// OutputWatermarker is what a stateful kind whose outputs are results of its own rather than the
// messages it read declares (StatefulStage.OutputWatermarker, with flow.Kind.Results: an
// aggregate's windows): OutputWatermark returns the earliest event time a result it writes later
// can carry, given its input's watermark (for windows, their start: the watermark less grace and
// the window's size), before its holds (see State.Hold). The readers of its results take it as their watermark. A kind whose outputs are the
// messages it read passes its input's watermark on and needs none of this.
type OutputWatermarker interface {
	OutputWatermark(watermark time.Time) time.Time
}

// StatePrefetcher is what a stateful kind that can tell, before a batch is processed, which state
// keys Process will read for a message declares (StatefulStage.StatePrefetcher): the runtime then
// reads a batch's keys in one round trip, instead of one per key as Process asks. A key named but
// not read costs a little; a key read but not named is read when Process asks. StateKeys appends
// to keys and returns it; it may decode m, and must not change the state.
type StatePrefetcher interface {
	StateKeys(m *Message, keys []string) []string
}

// TimerStatePrefetcher is what a TimerHandler that can tell which state keys OnTimer reads for a
// timer declares: the runtime then reads the keys of a batch's due timers in one round trip,
// instead of one per timer (a join's or a pattern's timer per key). TimerStateKeys appends to keys
// and returns it; it must not change the state.
type TimerStatePrefetcher interface {
	TimerStateKeys(timer string, keys []string) []string
}

// Clock is the source of time of the kinds and of the runtime that runs them, so that a test can
// drive a whole pipeline on a virtual clock.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that fires every d.
	NewTicker(d time.Duration) Ticker
}

// Sleep waits d on the clock, or until ctx ends (it then returns ctx's error): a source's wait
// before it tries its upstream system again.
func Sleep(ctx context.Context, clock Clock, d time.Duration) error {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// Ticker is a Clock's ticker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Timer is a Clock's timer.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock is the wall clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time                 { return time.Now() }
func (SystemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

func (SystemClock) NewTicker(d time.Duration) Ticker { return systemTicker{time.NewTicker(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time        { return t.t.C }
func (t systemTimer) Stop() bool                 { return t.t.Stop() }
func (t systemTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

type systemTicker struct{ t *time.Ticker }

func (t systemTicker) C() <-chan time.Time   { return t.t.C }
func (t systemTicker) Stop()                 { t.t.Stop() }
func (t systemTicker) Reset(d time.Duration) { t.t.Reset(d) }

// Outcome is what a stateful kind says became of a message besides its outputs, for the node's
// counters (the job summary, metrics, flowrun test's metrics.NODE).
type Outcome int

const (
	// Late: the message came after the windows it belongs to had closed.
	Late Outcome = iota + 1
	// Duplicate: the message repeated one seen before.
	Duplicate
)
