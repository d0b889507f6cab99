package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sourcegraph/conc"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/backpressure"
	"github.com/flowrun/flowrun/runtime/outage"
	"github.com/flowrun/flowrun/runtime/redact"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The engine's loop, at the top: the runner assembles the nodes of the plan that this process
// runs (assemble.go, fusion.go), checks at start what the run needs of Redis (access.go), starts
// the ownership of partitions (ownership.go, which starts a worker per unit: worker.go), the
// producing sources and the timed loops, and shuts them down in order. The public side is
// runtime.go (Run, New, Runtime) and options.go (Options).

// runner is one Run of a plan.
type runner struct {
	plan    *flow.Plan
	opts    Options
	rdb     *redis.Client
	log     *slog.Logger
	started atomic.Int64 // when the run started, in Unix nanoseconds; 0 before

	nodes     []*node                       // every node this process runs, in plan order
	producers []*producingSource            // sources that produce messages (generate, file, stdin)
	src       *sourceRun                    // what they need of the run
	units     []*unit                       // every partition of a consuming node this process runs
	tables    map[string]stages.TableReader // a reader of each table of the plan, for lookups (tables.go)
	// closing is set when a job's inputs are drained: the watermarks close, and the stateful stages
	// with timers close what is open (their windows). closeSources is closed with it, to wake the
	// producing sources' watermarks (source_time.go).
	closing      atomic.Bool
	closeSources chan struct{}

	// dedupTTL is how long effectively-once markers live: longer than an input can take to be
	// delivered again after its outputs were written (a lease expiring, an entry going idle).
	dedupTTL time.Duration

	// processing is what the per-message path needs of the run: the clock, the activity count,
	// the context that ends work in flight, the keys, tracing and metrics, the dead letters.
	processing

	drainKick    chan struct{}             // wakes a job's end test (watchDrain): something may have finished
	own          atomic.Pointer[ownership] // set when the run starts
	backpressure *backpressure.Gates
	poll         poll
	// obs is what the run keeps for its operators: the dead-letter log, the rate samples.
	obs observations

	failures // ends the run on an error; meets a failing Redis

	// layoutMu guards plan, nodes and units, which a reload replaces (reload.go), for the loops
	// that read them while the run goes on (layout, currentNodes); the runner's own steps at start
	// and at the end, which no reload overlaps, read the fields directly.
	layoutMu sync.RWMutex
	// reloading is held by a reload from start to end, and by the shutdown once the run ends;
	// running says, under it, that the run has started and not yet begun to stop.
	reloading sync.Mutex
	running   bool

	mu  sync.Mutex
	out *stages.LineWriter // the stdout sinks' shared output (guarded by mu)
}

func newRunner(plan *flow.Plan, opts Options) (*runner, error) {
	r := &runner{
		plan: plan,
		opts: opts,
		// Larger entries are dead-lettered unread; larger payloads are written under keys of their own.
		rdb:       opts.Redis.WithMaxEntrySize(plan.MaxMessageSize).WithOffloadOver(plan.OffloadOver).WithClock(redisClock{opts.Clock}),
		drainKick: make(chan struct{}, 1), closeSources: make(chan struct{}),
		log: redact.Logger(opts.Logger, plan.Redact, plan.HasSecrets()).With("pipeline", plan.Name),
	}
	r.processing = processing{log: r.log, clock: opts.Clock, keys: redis.Keys{Prefix: plan.KeyPrefix},
		deadLetters: &r.obs.deadLetters, redact: plan.Redact, retryInPlaceUpTo: opts.RetryInPlaceUpTo,
		pipelinePath: opts.PipelinePath, stage: r.stageNode, dropped: opts.Dropped}
	r.activity = &Activity{parent: opts.Activity, idle: r.drainKick}
	r.tracing = newTracing(opts.TracerProvider, opts.SampleRoot, plan.Redact)
	r.obs.rates.every = opts.SampleInterval // 0: the default
	r.failures.log, r.outage = r.log, outage.New(r.log, r.clock)
	r.rand = opts.Rand
	r.failures.checkAccess = func() error { return r.checkAccess(r.hard) }
	r.streams = map[string][]string{}
	for _, t := range plan.Topics {
		r.streams[t.Name] = r.keys.Streams(t.Name, t.Partitions)
	}
	if err := r.keys.Validate(); err != nil {
		return nil, &ConfigError{fmt.Sprintf("pipeline %s: %v", plan.Name, err)}
	}
	r.backpressure = backpressure.New(r.rdb, plan, r.keys, r.clock)
	r.src = &sourceRun{processing: &r.processing, failures: &r.failures, log: r.log, rdb: r.rdb, plan: plan, opts: &r.opts,
		backpressure: r.backpressure, dedupTTL: &r.dedupTTL, closing: &r.closing, closeSources: r.closeSources,
		kickDrain: r.kickDrain}
	r.tables = r.tableReaders()
	if err := r.addNodes(); err != nil {
		return nil, err
	}
	r.dedupTTL = redis.DefaultDedupTTL
	if opts.UntilDrained {
		r.waitForSources()
	}
	r.configureNodes()
	if !opts.NoFusion {
		r.fusing().fuse(nil)
	}
	if err := r.checkJob(); err != nil {
		return nil, err
	}
	return r, nil
}

// layout returns the nodes and units this process runs now.
func (r *runner) layout() ([]*node, []*unit) {
	r.layoutMu.RLock()
	defer r.layoutMu.RUnlock()
	return r.nodes, r.units
}

// currentNodes returns the nodes this process runs now.
func (r *runner) currentNodes() []*node {
	nodes, _ := r.layout()
	return nodes
}

// currentPlan returns the plan this process runs now.
func (r *runner) currentPlan() *flow.Plan {
	r.layoutMu.RLock()
	defer r.layoutMu.RUnlock()
	return r.plan
}

// stageNode is the stage named name that this process runs, or nil.
func (r *runner) stageNode(name string) *node {
	for _, n := range r.currentNodes() {
		if n.typ == "stage" && n.name == name {
			return n
		}
	}
	return nil
}

// access is the check of the run's permissions, once its nodes are assembled: at start, and again
// after an outage, of the nodes it runs then.
func (r *runner) access() *accessCheck {
	r.layoutMu.RLock()
	defer r.layoutMu.RUnlock()
	return &accessCheck{processing: &r.processing, rdb: r.rdb, plan: r.plan, nodes: r.nodes, units: r.units,
		producers: r.producers, backpressure: r.backpressure, resetState: r.opts.ResetState}
}

// checkAccess checks the run's permissions (accessCheck.checkAccess).
func (r *runner) checkAccess(ctx context.Context) error { return r.access().checkAccess(ctx) }

// fusing is the fusion of the nodes this process runs.
func (r *runner) fusing() *fusion {
	return &fusion{processing: &r.processing, plan: r.plan, rdb: r.rdb, nodes: r.nodes, units: &r.units, addUnits: r.addUnits}
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
	for _, n := range r.nodes {
		r.configureNode(n, r.plan)
		r.dedupTTL = max(r.dedupTTL, 4*(r.opts.LeaseTTL+n.claimIdle))
	}
}

// configureNode gives a node of the plan what the run decides for it; see configureNodes.
func (r *runner) configureNode(n *node, plan *flow.Plan) {
	written := plan.WrittenTopics()
	readLimits := cappedReads(plan)
	n.transientRetry = n.retry
	if n.retry.Name == "" {
		n.transientRetry = flow.DefaultTransientRetry
	}
	n.breaker = newBreaker(n.log, n.transientRetry, r.clock, plan.Redact, r.jittered, r.activity)
	if n.handler != nil { // producing sources process nothing
		n.process = r.layers(n)
	}
	n.readCount = int64(r.opts.BatchSize)
	if limit, ok := readLimits[n.typ+"."+n.name]; ok && limit < n.readCount {
		n.readCount = limit
	}
	if n.maxRead > 0 {
		n.readCount = min(n.readCount, n.maxRead)
	}
	n.spanName = "process " + n.inputName()
	n.startsTraces = n.input == nil || !written[n.input.Name]
	n.claimIdle = claimIdle(n)
}

// checkJob refuses job mode with a source that never ends.
func (r *runner) checkJob() error {
	if r.opts.UntilDrained {
		for _, p := range r.producers {
			if !p.finite {
				return &ConfigError{fmt.Sprintf("--until-drained: source %q never ends (a %s source as configured); "+
					"give it an end, such as a generate source's count, or run the pipeline as a service", p.node.name, p.node.kind)}
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

	own := newOwnership(runCtx, r)
	r.own.Store(own)
	var wg conc.WaitGroup
	r.startLoops(runCtx, &wg, own)
	r.reloading.Lock()
	r.running = true
	r.reloading.Unlock()

	<-runCtx.Done()
	if ctx.Err() != nil {
		// Stopped from outside (SIGINT, SIGTERM): the drain can take a while, so say it has begun.
		r.log.Info("stopping: reading nothing new, finishing the work in flight", "drain_timeout", r.opts.DrainTimeout)
	}
	// Shutdown: stop reading now; give work in flight DrainTimeout to finish and commit.
	stopDrainTimer := r.startDrainTimer(stopHard)
	defer stopDrainTimer()
	// A reload under way ends first (it holds workers it stopped and nodes it opened); the drain
	// timer bounds its wait for the batches in flight of the nodes it stops, as it bounds the stop's.
	r.reloading.Lock()
	r.running = false
	r.reloading.Unlock()
	readersDone := make(chan struct{})
	go wakeReaders(r.hard, r.rdb, r.clock, r.opts.Block, readersDone)
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
		r.fusing().checkFusedLinks(ctx)
	}
	if err := r.checkAccess(ctx); err != nil {
		return err
	}
	sc := &stateCheck{rdb: r.rdb, keys: r.keys, log: r.log, plan: r.plan, nodes: r.nodes}
	if err := sc.checkStatePartitions(ctx); err != nil {
		return err
	}
	f, err := sc.checkStateFingerprints(ctx, r.opts.ResetState)
	if err != nil {
		return err
	}
	if _, err := sc.applyFingerprints(ctx, f); err != nil {
		return err
	}
	sc.warnIfStateMayBeEvicted(ctx)
	if err := reopenMarks(ctx, r.rdb, markHashes(r.keys, r.nodes, outputsOf(r.producers))); err != nil {
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
	if err := registerMetrics(r.opts.MeterProvider, r.opts.Histograms, &r.processing, r.currentNodes, r.collect); err != nil {
		r.closeNodes()
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// collect reads what the metrics observe of the run: whether Redis fails, the last poll, the
// leases held.
func (r *runner) collect() collected {
	_, failing := r.outage.Failing()
	r.poll.mu.Lock()
	c := collected{failing: failing, partitions: r.poll.partitions, deadLetters: r.poll.deadLetters, leases: -1}
	r.poll.mu.Unlock()
	if own := r.own.Load(); own != nil {
		c.leases, _ = own.holdings()
	}
	for _, p := range r.producers {
		if lag := p.upstreamLag.Load(); lag >= 0 {
			c.upstreamLags = append(c.upstreamLags, sourceLag{p.node.name, lag})
		}
	}
	return c
}

// startLoops starts the run's loops: the poll, the ownership (which starts the workers), the
// producing sources, a job's end test and the trimming of retained topics.
func (r *runner) startLoops(ctx context.Context, wg *conc.WaitGroup, own *ownership) {
	pl := &poller{processing: &r.processing, rdb: r.rdb, opts: &r.opts, layout: r.layout, producers: r.producers,
		poll: &r.poll, obs: &r.obs}
	wg.Go(func() { pl.pollLoop(ctx) })
	wg.Go(func() { own.run(ctx) })
	for _, p := range r.producers {
		wg.Go(func() { r.src.runProducer(ctx, own, p) })
	}
	if r.opts.UntilDrained {
		dw := &drainWatch{processing: &r.processing, failures: &r.failures, log: r.log, rdb: r.rdb, nodes: r.nodes,
			units: r.units, producers: r.producers, closing: &r.closing, closeSources: r.closeSources, drainKick: r.drainKick}
		wg.Go(func() { dw.watchDrain(ctx) })
	}
	if hasRetention(r.plan) {
		trim := &trimmer{rdb: r.rdb, plan: r.plan, keys: r.keys, clock: r.clock, log: r.log, every: r.opts.TrimInterval}
		wg.Go(func() { trim.run(ctx) })
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

// summary is taken once every worker has stopped, so the dead-letter warnings still held back by
// the rate limit are logged first: nothing dead-lettered later could join them.
func (r *runner) summary() *Summary {
	r.obs.deadLetters.flush(r.log, r.opts.PipelinePath, r.clock.Now(), true)
	return &Summary{Elapsed: r.clock.Now().Sub(time.Unix(0, r.started.Load())), Nodes: nodeSummaries(r.nodes, &r.obs.deadLetters), Path: r.opts.PipelinePath}
}

// end returns the run's summary and the error that ended it.
func (r *runner) end(ctx context.Context) (*Summary, error) {
	summary := r.summary()
	err := r.err()
	if err == nil && ctx.Err() == nil && !r.opts.UntilDrained {
		err = errors.New("runtime: stopped without a cause") // should not happen: say so rather than exit 0
	}
	r.log.Info("pipeline stopped", "elapsed", summary.Elapsed.Round(time.Millisecond))
	return summary, err
}

// maxMessageSize is the largest entry the pipeline takes (max_message_size).
func (r *runner) maxMessageSize() int64 { return maxMessageSize(r.plan) }

func (r *runner) closeNodes() {
	for _, n := range r.nodes {
		if err := n.close(); err != nil {
			r.log.Error("closing", "node", n.name, "err", err)
		}
	}
}

// kickDrain wakes the end test of a job; it never waits.
func (r *runner) kickDrain() {
	select {
	case r.drainKick <- struct{}{}:
	default:
	}
}
