package runtime

import (
	"cmp"
	"context"
	"time"

	"github.com/sourcegraph/conc"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// observations is what a run keeps to tell its operators what happens beyond the counters: the
// dead-letter log with its reasons, the samples that rates are computed from, and the history that
// the live page draws (history.go).
type observations struct {
	deadLetters deadLetterLog
	rates       rateSamples
	history     history
}

// observeLoop samples the counters for the rates and the history, and logs the dead-letter summaries that are due,
// on a timer of its own: neither depends on who reads them, or how often.
func (r *poller) observeLoop(ctx context.Context) {
	every := r.obs.rates.interval()
	ticker := r.clock.NewTicker(every)
	defer ticker.Stop()
	for {
		now := r.clock.Now()
		nodes, _ := r.layout()
		counts := sampleCounts(nodes)
		r.obs.rates.add(now, nodeNames(nodes), counts)
		in := make(map[string]int64, len(counts))
		for i, c := range counts {
			in[nodes[i].name] = c.in
		}
		r.obs.history.add(now, in, r.inputLags())
		r.obs.deadLetters.flush(r.log, r.opts.PipelinePath, now, false)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// sampleCounts is the nodes' counters that their rates are made of.
func sampleCounts(nodes []*node) []nodeCounts {
	counts := make([]nodeCounts, len(nodes))
	for i, n := range nodes {
		nc := n.stats.counts()
		counts[i] = nodeCounts{in: nc.in, out: nc.written, dead: nc.deadLettered, late: nc.late, duplicates: nc.duplicates}
	}
	return counts
}

// nodeNames is the names of the nodes, in their order.
func nodeNames(nodes []*node) []string {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.name
	}
	return names
}

// poller reads the state of the streams for Snapshot, readiness and metrics (poll), and samples
// the counters for the rates (observe.go): of the nodes and units this process runs, with the
// client, the options' intervals, and the per-message path's clock, keys and logger. It also
// publishes the upstream lag that the sources this process runs report, for flowrun inspect.
type poller struct {
	*processing
	rdb  *redis.Client
	opts *Options
	// layout returns the nodes and units this process runs now (a reload changes them).
	layout    func() ([]*node, []*unit)
	producers []*producingSource
	poll      *poll         // the runner's, which Snapshot reads
	obs       *observations // the runner's
}

// pollLoop reads the streams' state every PollInterval until ctx ends. It also runs observeLoop,
// which samples the counters every second: a poll of Redis may take longer than that.
func (r *poller) pollLoop(ctx context.Context) {
	var wg conc.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.observeLoop(ctx) })
	ticker := r.clock.NewTicker(r.opts.PollInterval)
	defer ticker.Stop()
	for {
		r.pollOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// pollOnce reads the state of every unit's input and every dead-letter stream. A stream that does
// not exist yet (nothing was written to it) reads as empty. A read that fails spoils only its own
// unit or stream, which keeps its last known state: the others are still shown, and the error is
// kept for readiness.
func (r *poller) pollOnce(ctx context.Context) {
	r.poll.mu.Lock()
	previous, previousDead := r.poll.partitions, r.poll.deadLetters
	r.poll.mu.Unlock()
	last := map[*unit]PartitionState{}
	for _, ps := range previous {
		last[ps.unit] = ps
	}

	var parts []PartitionState
	dead := map[string]int64{}
	var firstErr error
	nodes, units := r.layout()
	for _, u := range units {
		ps, err := r.pollUnit(ctx, u)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			var ok bool
			if ps, ok = last[u]; !ok {
				continue
			}
		}
		parts = append(parts, ps)
	}
	for _, n := range nodes {
		length, err := r.rdb.StreamLen(ctx, r.keys.DeadLetter(n.name))
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			var ok bool
			if length, ok = previousDead[n.name]; !ok {
				continue
			}
		}
		dead[n.name] = length
	}
	firstErr = cmp.Or(firstErr, r.publishUpstreamLags(ctx))
	r.poll.mu.Lock()
	defer r.poll.mu.Unlock()
	r.poll.at, r.poll.err = r.clock.Now(), firstErr
	r.poll.partitions, r.poll.deadLetters = parts, dead
	if firstErr != nil && ctx.Err() == nil {
		r.log.Debug("polling the streams failed", "err", firstErr)
	}
}

// publishUpstreamLags publishes the upstream lag of each source this process runs that reports
// one, for three poll intervals: a process that dies, or a source that stops, leaves no stale
// figure behind for long.
func (r *poller) publishUpstreamLags(ctx context.Context) error {
	var firstErr error
	now := r.clock.Now()
	for _, p := range r.producers {
		lag := p.upstreamLag.Load()
		if lag < 0 {
			continue
		}
		report := redis.UpstreamLag{Lag: lag, At: now.UTC(), Process: r.opts.ProcessID}
		err := r.rdb.PublishUpstreamLag(ctx, r.keys.SourceUpstreamLag(p.node.name), report, 3*r.opts.PollInterval)
		firstErr = cmp.Or(firstErr, err)
	}
	return firstErr
}

// pollUnit reads one unit's input: a partition of a topic, or a redis_stream source's stream; for
// a stateful stage, its own watermark in the partition too.
func (r *poller) pollUnit(ctx context.Context, u *unit) (PartitionState, error) {
	ps := PartitionState{unit: u, Node: u.node.name, Stream: u.stream, Partition: u.partition}
	if u.node.input != nil {
		ps.Topic = u.node.input.Name
	}
	info, states, err := r.rdb.PollReaders(ctx, u.stream, redis.ReaderKeys{Group: u.node.group, RetryKey: u.retryKey})
	if err != nil {
		return ps, err
	}
	st := states[0]
	ps.Length, ps.Lag, ps.Pending, ps.Retries = info.Length, st.Lag, st.Pending, st.Retries
	if u.node.stateful {
		wm, found, err := r.rdb.Watermark(ctx, r.keys.State(u.node.input.Name, u.partition, u.node.name))
		if err != nil {
			return ps, err
		}
		if found {
			ps.Watermark = time.UnixMilli(wm).UTC()
		}
	}
	return ps, nil
}
