package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/flowrun/flowrun/flow"
)

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

// Plan is the plan the runtime runs: the last one a reload applied.
func (rt *Runtime) Plan() *flow.Plan { return rt.r.currentPlan() }

// Snapshot returns what the pipeline is doing now.
func (rt *Runtime) Snapshot() Snapshot {
	r := rt.r
	s := Snapshot{Taken: rt.r.clock.Now()}
	if start := r.started.Load(); start != 0 {
		s.Elapsed = s.Taken.Sub(time.Unix(0, start))
	}
	nodes := r.currentNodes()
	s.Nodes = nodeSummaries(nodes, &r.obs.deadLetters)
	s.Rates = r.obs.rates.rates(nodeNames(nodes))
	for _, p := range r.producers {
		s.Sources = append(s.Sources, SourceProgress{
			Name: p.node.name, Produced: p.node.stats.counts().in, Total: p.total, Done: p.done.Load(),
			Unwritten: p.unwritten.Load(), UpstreamLag: p.upstreamLag.Load(),
		})
	}
	r.poll.mu.Lock()
	s.Polled, s.PollErr = r.poll.at, r.poll.err
	s.Partitions = append([]PartitionState(nil), r.poll.partitions...)
	s.DeadLetters = map[string]int64{}
	for k, v := range r.poll.deadLetters {
		s.DeadLetters[k] = v
	}
	r.poll.mu.Unlock()
	if own := r.own.Load(); own != nil {
		s.Leases, s.Balanced = own.holdings()
	}
	s.RedisFailingSince, _ = r.outage.Failing()
	return s
}

// Ready reports whether the pipeline is working: Redis answered the last poll, recently, and this
// process holds its share of the partitions, or as many as it could take (the others hold the
// rest: with more processes than partitions, some hold none and are ready to take over).
func (rt *Runtime) Ready() error {
	s := rt.Snapshot()
	switch {
	case s.Polled.IsZero():
		return errNotStarted
	case s.PollErr != nil:
		return s.PollErr
	case rt.r.clock.Now().Sub(s.Polled) > 3*rt.r.opts.PollInterval+time.Second:
		return errStalePoll
	case !s.Balanced:
		return errUnbalanced
	}
	return nil
}
