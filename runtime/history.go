package runtime

import (
	"sync"
	"time"
)

// The live page draws, per node, the last 15 minutes of its rate and of its input's lag. The
// runtime keeps them in memory, from its own samples of the counters (observeLoop) and its polls of
// the streams: a point every historyStep, historyPoints of them. They start empty when the process
// starts, and cover what this process saw, as its counters do.

const (
	historyStep   = 10 * time.Second
	historyPoints = 90 // 15 minutes
)

// History is what the nodes did over the last minutes, a point every Step, oldest first.
type History struct {
	Step time.Duration
	// Times are when each point was taken.
	Times []time.Time
	// Nodes are each node's points, by node name, one for each of Times.
	Nodes map[string]NodeHistory
}

// NodeHistory is one node's points.
type NodeHistory struct {
	// Rate is the messages it took in per second over the step before each point (a producing
	// source: produced).
	Rate []float64
	// Lag is its input's lag as of the last poll before each point: the entries of its input
	// partitions (a redis_stream source: of its stream) not yet delivered to it, or what a source
	// reading a broker last reported of its upstream; -1 where it is not known.
	Lag []int64
}

// history keeps the points, as a ring of historyPoints.
type history struct {
	mu     sync.Mutex
	last   time.Time        // the last point's time
	counts map[string]int64 // each node's in at the last point
	points []historyPoint
}

type historyPoint struct {
	at    time.Time
	rates map[string]float64
	lags  map[string]int64
}

// add takes a point if a step has passed since the last: in is each node's in counter, lags its
// input's lag (absent where it is not known). The first call only takes the counters to measure
// the next point's rates from.
func (h *history) add(now time.Time, in map[string]int64, lags map[string]int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts != nil && now.Sub(h.last) < historyStep {
		return
	}
	if h.counts != nil {
		seconds := now.Sub(h.last).Seconds()
		p := historyPoint{at: now, rates: make(map[string]float64, len(in)), lags: lags}
		for name, n := range in {
			p.rates[name] = max(0, float64(n-h.counts[name])/seconds)
		}
		if len(h.points) == historyPoints {
			h.points = append(h.points[:0], h.points[1:]...)
		}
		h.points = append(h.points, p)
	}
	h.last, h.counts = now, in
}

// snapshot copies the points, for the nodes named.
func (h *history) snapshot(names []string) History {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := History{Step: historyStep, Times: make([]time.Time, len(h.points)), Nodes: make(map[string]NodeHistory, len(names))}
	for i, p := range h.points {
		out.Times[i] = p.at
	}
	for _, name := range names {
		nh := NodeHistory{Rate: make([]float64, len(h.points)), Lag: make([]int64, len(h.points))}
		for i, p := range h.points {
			nh.Rate[i] = p.rates[name]
			lag, known := p.lags[name]
			if !known {
				lag = -1
			}
			nh.Lag[i] = lag
		}
		out.Nodes[name] = nh
	}
	return out
}

// History returns what the nodes did over the last 15 minutes, a point every 10 seconds of the
// runtime's clock; empty until the process has run for a step.
func (rt *Runtime) History() History {
	nodes, _ := rt.r.layout() // a reload may have changed them
	return rt.r.obs.history.snapshot(nodeNames(nodes))
}

// inputLags are what the last poll read of each node's input lag, summed over its partitions, and
// the upstream lag that producing sources report.
func (r *poller) inputLags() map[string]int64 {
	lags := map[string]int64{}
	r.poll.mu.Lock()
	for _, p := range r.poll.partitions {
		lags[p.Node] += p.Lag
	}
	r.poll.mu.Unlock()
	for _, p := range r.producers {
		if lag := p.upstreamLag.Load(); lag >= 0 {
			lags[p.node.name] = lag
		}
	}
	return lags
}
