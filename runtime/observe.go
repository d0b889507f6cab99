package runtime

import (
	"context"
)

// observations is what a run keeps to tell its operators what happens beyond the counters: the
// dead-letter log with its reasons, and the samples that rates are computed from.
type observations struct {
	deadLetters deadLetterLog
	rates       rateSamples
}

// observeLoop samples the counters for the rates and logs the dead-letter summaries that are due,
// on a timer of its own: neither depends on who reads them, or how often.
func (r *poller) observeLoop(ctx context.Context) {
	every := r.obs.rates.interval()
	ticker := r.clock.NewTicker(every)
	defer ticker.Stop()
	for {
		now := r.clock.Now()
		r.obs.rates.add(now, sampleCounts(r.nodes))
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
