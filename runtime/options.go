package runtime

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// MaxBatchSize is the most entries one read may take, and the default.
const MaxBatchSize = redis.DefaultReadCount

// Options configure Run. The zero value of every field but Redis is a sane default.
type Options struct {
	// Redis is the connection to run on; the caller opens and closes it.
	Redis *redis.Client
	// Clock is the run's only source of time: its timers, tickers, timestamps and the kinds' Env.
	// Default: the wall clock (stages.SystemClock).
	Clock stages.Clock
	// Nodes limits this process to the named sources, stages and sinks; empty runs them all. Several
	// processes can split a pipeline this way, or run all of it and share the partitions.
	Nodes []string
	// UntilDrained makes Run return once every source is exhausted and no stage or sink has anything
	// left to do: job mode. Every source must then be finite.
	UntilDrained bool
	// LeaseTTL is how long a partition's lease lasts without renewal, and so the longest a dead
	// process's partitions wait before another process takes them. Default 10s.
	LeaseTTL time.Duration
	// DrainTimeout bounds shutdown: batches still in flight after it are abandoned unacknowledged, for
	// another process (or the next start) to redo. Default 10s.
	DrainTimeout time.Duration
	// BatchSize is the most entries one read takes (XREADGROUP COUNT), and a source writes at
	// once. Default and most MaxBatchSize.
	BatchSize int
	// Block is how long a read waits for new entries. Default 500ms. A stop ends idle reads at once
	// where the client can (redis.Client.UnblockReads: a single server, a user allowed CLIENT
	// UNBLOCK); elsewhere it waits up to Block for them to return.
	Block time.Duration
	// RetryInPlaceUpTo is the longest retry delay waited in the process even where retries could
	// wait in Redis (retry_in_place = false): a round trip through the retry set is not worth a
	// shorter wait. Default 1s.
	RetryInPlaceUpTo time.Duration
	// RetryPoll is how often a unit looks for due retries it was not told about (a dead letter
	// replayed with flowrun dlq replay, retries scheduled by a previous owner). Default 1s.
	RetryPoll time.Duration
	// PollInterval is how often the state of the streams (lag, pending, dead letters, stateful
	// stages' watermarks) is read for Snapshot, metrics and readiness. Default 2s.
	PollInterval time.Duration
	// SampleInterval is how often the counters are sampled for the rates that the live page and
	// Snapshot show (each an average over five samples), and the dead-letter summaries that are due
	// are logged. Default 1s.
	SampleInterval time.Duration
	// TrimInterval is how often topics with a retention block are trimmed. Default 10s.
	TrimInterval time.Duration
	// Stdin feeds stdin sources and Stdout receives stdout sinks' lines. Default os.Stdin, os.Stdout.
	Stdin  io.Reader
	Stdout io.Writer
	// HTTPClient sends the requests of http sinks. Default: a client without a global timeout (each
	// sink has its own).
	HTTPClient *http.Client
	// TracerProvider makes the spans of the messages' traces; nil traces nothing (trace context that
	// messages carry is passed on unchanged).
	TracerProvider trace.TracerProvider
	// SampleRoot, when set, decides whether a message that enters the pipeline without trace
	// context starts a sampled trace, before any span is built: false costs what tracing off costs.
	// It stands in for the TracerProvider's sampling of new traces (a ratio, say), which should
	// then sample every root it is asked for. nil leaves the decision to the TracerProvider.
	SampleRoot func() bool
	// MeterProvider records the metrics; nil records none.
	MeterProvider metric.MeterProvider
	// Histograms, with a MeterProvider, keeps the per-message histograms (processing time and age)
	// in the process instead of recording them through the MeterProvider, for a reader that takes
	// it as a Producer (flowrun run's Prometheus exporter does): the same histograms, at a
	// fraction of the cost (see Histograms). nil records them through the MeterProvider.
	Histograms *Histograms
	// Logger receives the runtime's log. Default slog.Default().
	Logger *slog.Logger
	// ProcessID names this process as a consumer and lease owner. Default: host name, process ID and
	// a random suffix, unique per start. It must be unique per start: entries pending for this ID
	// that the process takes back (a lease it lost and took again) do not count as deliveries, so a
	// process restarted under the same ID would hide a message that kills it from the poison check.
	ProcessID string
	// Rand draws the jitter of retry and backoff delays. Default: a generator with a random seed. A
	// test seeds it, so that a failing run can be replayed. The runtime draws from it under a lock.
	Rand *rand.Rand
	// Activity, when set, counts the run's goroutines at work (see Activity): a test on a virtual
	// Clock moves time on only when none is.
	Activity *Activity
	// NodeEnv, when set, may change the environment each node's kind is made with (a test points an
	// http sink at canned answers, replaces Go stage functions with mocks). It gets the node's type
	// ("source", "stage" or "sink") and name.
	NodeEnv func(typ, name string, env *stages.Env)
	// WrapSource, when set, returns the source to use in place of the one the kind made for the
	// producing source named name (a test's sources produce what the test sends). The kind's traits
	// still apply; the replacement's optional lifecycle is the one that runs.
	WrapSource func(name string, made stages.Source) stages.Source
	// WrapSink, when set, returns the sink to use in place of the one the kind made for the sink
	// named name (a test captures what sinks receive). The replacement's optional lifecycle
	// (stages.Opener, stages.Flusher, io.Closer) is the one that runs.
	WrapSink func(name string, made stages.Sink) stages.Sink
	// Dropped, when set, is told of each message that a stateful stage passed on nowhere (counted
	// dropped: late = "drop", duplicates = "drop"), with why ("late" or "repeated"), as the
	// attempt that dropped it succeeds: a test names them. A batch processed again (after a crash)
	// may tell of a message again. It is called from the goroutines that process messages.
	Dropped func(stage, key string, payload []byte, why string)
	// NoFusion runs every stage in a hop of its own, as if each set fuse = false (flow.Chain).
	NoFusion bool
	// ResetState names stateful stages whose state the run deletes, at start or on a reload, when
	// their definition changed so that the state no longer means what the stage reads it as (their
	// state fingerprint changed: state_fingerprints.go). Without it such a stage is refused.
	ResetState []string
	// PipelinePath is the pipeline's path as the user gave it, for the commands that the log and the
	// summary suggest (flowrun dlq list PATH --stage NAME). Default "PATH".
	PipelinePath string
}

func (o *Options) applyDefaults() {
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 10 * time.Second
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 10 * time.Second
	}
	if o.BatchSize <= 0 {
		o.BatchSize = redis.DefaultReadCount
	}
	if o.BatchSize > redis.DefaultReadCount {
		o.BatchSize = redis.DefaultReadCount
	}
	if o.Block <= 0 {
		o.Block = 500 * time.Millisecond
	}
	if o.RetryInPlaceUpTo <= 0 {
		o.RetryInPlaceUpTo = time.Second
	}
	if o.RetryPoll <= 0 {
		o.RetryPoll = time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 2 * time.Second
	}
	if o.TrimInterval <= 0 {
		o.TrimInterval = 10 * time.Second
	}
	if o.Stdin == nil {
		o.Stdin = os.Stdin
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{}
	}
	if o.Clock == nil {
		o.Clock = stages.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Rand == nil {
		o.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if o.ProcessID == "" {
		o.ProcessID = newProcessID()
	}
}

func newProcessID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "flowrun"
	}
	var b [3]byte
	_, _ = crand.Read(b[:]) // crypto/rand does not fail on supported platforms
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// ConfigError is an error in how Run was asked to run the plan (an unknown node name, job mode with
// an endless source): the command line's fault, not the pipeline's or Redis's.
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

// maxMessageSize is the largest entry the plan takes (max_message_size).
func maxMessageSize(plan *flow.Plan) int64 {
	if plan.MaxMessageSize > 0 {
		return plan.MaxMessageSize
	}
	return int64(flow.DefaultMaxMessageSize)
}
