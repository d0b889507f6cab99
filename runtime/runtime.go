package runtime

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sourcegraph/conc"
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
	// Logger receives the runtime's log. Default slog.Default().
	Logger *slog.Logger
	// ProcessID names this process as a consumer and lease owner. Default: host name, process ID and
	// a random suffix, unique per start.
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
	// NoFusion runs every stage in a hop of its own, as if each set fuse = false (flow.Chain).
	NoFusion bool
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

// Run runs the plan until ctx is canceled or, in job mode, until all work is done. It then stops
// reading, finishes and commits the batches in flight (within DrainTimeout), releases its leases and
// returns a summary of what each node did. The error is nil after a clean stop; a *ConfigError means
// the options do not suit the plan. It is New followed by Runtime.Run.
func Run(ctx context.Context, plan *flow.Plan, opts Options) (*Summary, error) {
	rt, err := New(plan, opts)
	if err != nil {
		return nil, err
	}
	return rt.Run(ctx)
}

// Runtime is a pipeline ready to run, or running: its Snapshot shows what it does while it runs.
type Runtime struct {
	r *runner
}

// New checks the options against the plan and prepares the run.
func New(plan *flow.Plan, opts Options) (*Runtime, error) {
	if opts.Redis == nil {
		return nil, errors.New("runtime: no Redis client")
	}
	opts.applyDefaults()
	r, err := newRunner(plan, opts)
	if err != nil {
		return nil, err
	}
	return &Runtime{r: r}, nil
}

// Run runs the pipeline; see the package function Run. A Runtime runs once.
func (rt *Runtime) Run(ctx context.Context) (*Summary, error) { return rt.r.run(ctx) }

// Plan is the plan the runtime runs.
func (rt *Runtime) Plan() *flow.Plan { return rt.r.plan }

// runner is one Run of a plan.
type runner struct {
	plan    *flow.Plan
	opts    Options
	rdb     *redis.Client
	keys    redis.Keys
	log     *slog.Logger
	started atomic.Int64 // when the run started, in Unix nanoseconds; 0 before

	nodes     []*node            // every node this process runs, in plan order
	producers []*producingSource // sources that produce messages (generate, file, stdin)
	units     []*unit            // every partition of a consuming node this process runs
	// closing is set when a job's inputs are drained: the watermarks close, and the stateful stages
	// with timers close what is open (their windows). closeSources is closed with it, to wake the
	// producing sources' watermarks (source_time.go).
	closing      atomic.Bool
	closeSources chan struct{}

	// dedupTTL is how long effectively-once markers live: longer than an input can take to be
	// delivered again after its outputs were written (a lease expiring, an entry going idle).
	dedupTTL time.Duration

	// hard is canceled when shutdown has waited DrainTimeout: work in flight is abandoned then.
	hard context.Context

	clock        stages.Clock              // Options.Clock
	activity     *Activity                 // the run's count, which Options.Activity (if set) follows
	drainKick    chan struct{}             // wakes a job's end test (watchDrain): something may have finished
	randMu       sync.Mutex                // guards opts.Rand
	own          atomic.Pointer[ownership] // set when the run starts
	outage       outage
	backpressure *backpressure
	poll         poll
	tracing      tracing
	metrics      metrics
	streams      map[string][]string // the stream keys of every topic's partitions, made once
	// obs is what the run keeps for its operators: the dead-letter log, the rate samples.
	obs observations

	mu       sync.Mutex
	fatalErr error              // the first error that stops the run
	out      *stages.LineWriter // the stdout sinks' shared output
	stopRun  context.CancelFunc
}

func newRunner(plan *flow.Plan, opts Options) (*runner, error) {
	r := &runner{
		plan:  plan,
		opts:  opts,
		rdb:   opts.Redis.WithMaxEntrySize(plan.MaxMessageSize).WithClock(redisClock{opts.Clock}), // larger entries are dead-lettered unread
		clock: opts.Clock, drainKick: make(chan struct{}, 1), closeSources: make(chan struct{}),
		keys: redis.Keys{Prefix: plan.KeyPrefix},
		log:  redactLogger(opts.Logger, plan.Redact, plan.HasSecrets()).With("pipeline", plan.Name),
	}
	r.activity = &Activity{parent: opts.Activity, idle: r.drainKick}
	r.tracing = newTracing(opts.TracerProvider, opts.SampleRoot, plan.Redact)
	r.obs.rates.every = opts.SampleInterval // 0: the default
	r.outage.log, r.outage.clock = r.log, r.clock
	r.streams = map[string][]string{}
	for _, t := range plan.Topics {
		r.streams[t.Name] = r.keys.Streams(t.Name, t.Partitions)
	}
	if err := r.keys.Validate(); err != nil {
		return nil, &ConfigError{fmt.Sprintf("pipeline %s: %v", plan.Name, err)}
	}
	if err := r.addNodes(); err != nil {
		return nil, err
	}
	r.dedupTTL = redis.DefaultDedupTTL
	r.backpressure = newBackpressure(r.rdb, plan, r.keys, r.clock)
	r.configureNodes()
	if !opts.NoFusion {
		r.fuse(nil)
	}
	if err := r.checkJob(); err != nil {
		return nil, err
	}
	return r, nil
}

// addNodes adds the sources, stages and sinks that this process runs, in plan order.
func (r *runner) addNodes() error {
	selected, err := r.selectNodes()
	if err != nil {
		return err
	}
	for _, s := range r.plan.Sources {
		if !selected[s.Name] {
			continue
		}
		if err := r.addSource(s); err != nil {
			return err
		}
	}
	for _, s := range r.plan.Stages {
		if selected[s.Name] {
			if err := r.addStage(s); err != nil {
				return err
			}
		}
	}
	for _, s := range r.plan.Sinks {
		if selected[s.Name] {
			if err := r.addSink(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// configureNodes gives each node what the run decides for it: its transient retry policy and
// breaker, its layers, how much it reads at a time, its span name, whether it starts traces, how
// long its entries stay pending before another consumer takes them; and the dedup markers' TTL.
func (r *runner) configureNodes() {
	written := writtenTopics(r.plan)
	readLimits := cappedReads(r.plan)
	for _, n := range r.nodes {
		n.transientRetry = n.retry
		if n.retry.Name == "" {
			n.transientRetry = flow.DefaultTransientRetry
		}
		n.breaker = newBreaker(n, n.transientRetry, r)
		if n.handler != nil { // producing sources process nothing
			n.process = r.layers(n)
		}
		n.readCount = int64(r.opts.BatchSize)
		if limit, ok := readLimits[n.typ+"."+n.name]; ok && limit < n.readCount {
			n.readCount = limit
		}
		n.spanName = "process " + n.inputName()
		n.startsTraces = n.input == nil || !written[n.input.Name]
		n.claimIdle = claimIdle(n)
		r.dedupTTL = max(r.dedupTTL, 4*(r.opts.LeaseTTL+n.claimIdle))
	}
}

// checkJob refuses job mode with a source that never ends.
func (r *runner) checkJob() error {
	if r.opts.UntilDrained {
		for _, p := range r.producers {
			if !p.finite {
				return &ConfigError{fmt.Sprintf("--until-drained: source %q never ends (a generate source without count); "+
					"give it a count or run the pipeline as a service", p.node.name)}
			}
		}
	}
	return nil
}

// cappedReads returns, for each node that writes to topics with a max_lag (outputs and side
// outputs, such as an aggregate's late topic), the smallest of those: such a node reads no more at
// a time, so that one batch's outputs pass a cap by at most the cap.
func cappedReads(plan *flow.Plan) map[string]int64 {
	limits := map[string]int64{}
	for _, e := range plan.Edges {
		if !e.Writes() {
			continue
		}
		t := plan.Topic(strings.TrimPrefix(e.To, "topic."))
		if t == nil || t.MaxLag <= 0 {
			continue
		}
		if l, ok := limits[e.From]; !ok || t.MaxLag < l {
			limits[e.From] = t.MaxLag
		}
	}
	return limits
}

// writtenTopics returns the topics that some node of the plan writes (outputs, side outputs such
// as an aggregate's late topic, and dead letters), whichever process runs it.
func writtenTopics(plan *flow.Plan) map[string]bool {
	written := map[string]bool{}
	for _, e := range plan.Edges {
		if e.Writes() || e.Kind == flow.EdgeDeadLetter {
			written[strings.TrimPrefix(e.To, "topic.")] = true
		}
	}
	return written
}

// selectNodes resolves Options.Nodes against the plan.
func (r *runner) selectNodes() (map[string]bool, error) {
	all := map[string]bool{}
	var names []string
	for _, s := range r.plan.Sources {
		all[s.Name] = true
		names = append(names, s.Name)
	}
	for _, s := range r.plan.Stages {
		all[s.Name] = true
		names = append(names, s.Name)
	}
	for _, s := range r.plan.Sinks {
		all[s.Name] = true
		names = append(names, s.Name)
	}
	if len(r.opts.Nodes) == 0 {
		return all, nil
	}
	sort.Strings(names)
	selected := map[string]bool{}
	for _, n := range r.opts.Nodes {
		n = strings.TrimSpace(n)
		if !all[n] {
			return nil, &ConfigError{fmt.Sprintf("pipeline %s has no source, stage or sink %q; it has %s",
				r.plan.Name, n, strings.Join(names, ", "))}
		}
		selected[n] = true
	}
	if !r.opts.NoFusion {
		for _, c := range r.plan.Chains {
			var in, out []string
			for _, s := range c.Stages {
				if selected[s.Name] {
					in = append(in, s.Name)
				} else {
					out = append(out, s.Name)
				}
			}
			if len(in) > 0 && len(out) > 0 {
				return nil, &ConfigError{fmt.Sprintf("stages %s run fused, in one hop, so one process runs them all: "+
					"name %s too, set fuse = false on the stage after the one where the processes should part, or run with --no-fusion",
					strings.Join(c.Names(), ", "), strings.Join(out, ", "))}
			}
		}
	}
	return selected, nil
}

// run starts everything, waits for the end, and shuts down in order.
func (r *runner) run(ctx context.Context) (*Summary, error) {
	if err := r.checkAtStart(ctx); err != nil {
		return nil, err
	}
	r.started.Store(r.clock.Now().UnixNano())
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	r.stopRun = stopRun
	hard, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHard()
	r.hard = hard
	if err := r.openNodes(runCtx); err != nil {
		return nil, err
	}
	r.log.Info("pipeline starting", "process", r.opts.ProcessID, "nodes", len(r.nodes), "partitions", len(r.units),
		"job", r.opts.UntilDrained)

	own := newOwnership(r)
	r.own.Store(own)
	var wg conc.WaitGroup
	r.startLoops(runCtx, &wg, own)

	<-runCtx.Done()
	if ctx.Err() != nil {
		// Stopped from outside (SIGINT, SIGTERM): the drain can take a while, so say it has begun.
		r.log.Info("stopping: reading nothing new, finishing the work in flight", "drain_timeout", r.opts.DrainTimeout)
	}
	// Shutdown: stop reading now; give work in flight DrainTimeout to finish and commit.
	defer r.startDrainTimer(stopHard)()
	readersDone := make(chan struct{})
	go r.wakeReaders(readersDone)
	wg.Wait()
	own.shutdown(hard)
	close(readersDone)
	r.closeNodes()
	if r.out != nil {
		if err := r.out.Flush(); err != nil {
			r.fail(fmt.Errorf("writing to standard output: %w", err))
		}
	}
	return r.end(ctx)
}

// checkAtStart checks, before anything runs, what the run needs of Redis: fused links left from a
// run without fusion, the user's permissions, the stateful stages' partition counts; and reopens
// the watermarks.
func (r *runner) checkAtStart(ctx context.Context) error {
	if !r.opts.NoFusion {
		r.checkFusedLinks(ctx)
	}
	if err := r.checkAccess(ctx); err != nil {
		return err
	}
	if err := r.checkStatePartitions(ctx); err != nil {
		return err
	}
	r.warnIfStateMayBeEvicted(ctx)
	if err := r.reopenMarks(ctx); err != nil {
		return fmt.Errorf("reopening the watermarks: %w", err)
	}
	return nil
}

// openNodes opens every node and registers the metrics; on an error it closes the nodes.
func (r *runner) openNodes(ctx context.Context) error {
	for _, n := range r.nodes {
		if err := n.open(ctx); err != nil {
			r.closeNodes()
			return fmt.Errorf("%s %s: %w", n.typ, n.name, err)
		}
	}
	if err := r.registerMetrics(); err != nil {
		r.closeNodes()
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// startLoops starts the run's loops: the poll, the ownership (which starts the workers), the
// producing sources, a job's end test and the trimming of retained topics.
func (r *runner) startLoops(ctx context.Context, wg *conc.WaitGroup, own *ownership) {
	wg.Go(func() { r.pollLoop(ctx) })
	wg.Go(func() { own.run(ctx) })
	for _, p := range r.producers {
		wg.Go(func() { r.runProducer(ctx, own, p) })
	}
	if r.opts.UntilDrained {
		wg.Go(func() { r.watchDrain(ctx) })
	}
	if r.hasRetention() {
		wg.Go(func() { r.trimLoop(ctx) })
	}
}

// startDrainTimer abandons the work in flight (stopHard) once the shutdown has waited
// DrainTimeout. The function it returns ends the timer.
func (r *runner) startDrainTimer(stopHard context.CancelFunc) func() {
	drainTimer := r.clock.NewTimer(r.opts.DrainTimeout)
	drained := make(chan struct{})
	go func() {
		select {
		case <-drainTimer.C():
			r.log.Warn("drain timeout: abandoning work in flight, which other processes will redo", "timeout", r.opts.DrainTimeout)
			stopHard()
		case <-drained:
		}
	}()
	return func() { drainTimer.Stop(); close(drained) }
}

// end returns the run's summary and the error that ended it.
func (r *runner) end(ctx context.Context) (*Summary, error) {
	summary := r.summary()
	r.mu.Lock()
	err := r.fatalErr
	r.mu.Unlock()
	if err == nil && ctx.Err() == nil && !r.opts.UntilDrained {
		err = errors.New("runtime: stopped without a cause") // should not happen: say so rather than exit 0
	}
	r.log.Info("pipeline stopped", "elapsed", summary.Elapsed.Round(time.Millisecond))
	return summary, err
}

// maxMessageSize is the largest entry the pipeline takes (max_message_size).
func (r *runner) maxMessageSize() int64 {
	if r.plan.MaxMessageSize > 0 {
		return r.plan.MaxMessageSize
	}
	return int64(flow.DefaultMaxMessageSize)
}

// fail records the first error that ends the run, and stops it.
func (r *runner) fail(err error) {
	r.mu.Lock()
	if r.fatalErr == nil {
		r.fatalErr = err
	}
	r.mu.Unlock()
	r.log.Error("stopping", "err", err)
	r.stopRun()
}

// finish ends a job run without an error.
func (r *runner) finish() { r.stopRun() }

func (r *runner) closeNodes() {
	for _, n := range r.nodes {
		if err := n.close(); err != nil {
			r.log.Error("closing", "node", n.name, "err", err)
		}
	}
}
