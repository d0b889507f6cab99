package runtime

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Rates are measured from samples of the nodes' counters that the runtime takes on its own timer
// (observeLoop), never from the requests that show them: every viewer of /api/graph and of the
// page, however often it asks, sees the same rates until the next sample.

const (
	// rateSampleEvery is how often the counters are sampled, and rateWindowSamples how many sample
	// intervals a rate spans: rates are averages over the last 5 seconds, updated every second.
	rateSampleEvery   = time.Second
	rateWindowSamples = 5
)

// Rates are the nodes' rates over a window of samples.
type Rates struct {
	// Since and Until are the window's ends: when its first and last samples were taken; both are
	// zero until there are two samples, and every rate is 0 then.
	Since, Until time.Time
	Nodes        map[string]NodeRate // by node name
}

// Seconds is the window's length.
func (r Rates) Seconds() float64 { return r.Until.Sub(r.Since).Seconds() }

// NodeRate is what a node did per second over a window: messages taken in, entries written (a sink:
// messages delivered), messages dead-lettered, and the messages a stateful stage found late or
// repeated (whatever it did with them: with late or duplicates = topic.NAME, written there).
type NodeRate struct {
	In, Out, DeadLettered float64
	Late, Duplicates      float64
}

// rateSamples keeps the last samples of the counters.
type rateSamples struct {
	mu      sync.Mutex
	every   time.Duration // default rateSampleEvery
	window  int           // sample intervals per rate; default rateWindowSamples
	samples []counterSample
}

// counterSample is the counters of every node, in the runner's node order, at one time.
type counterSample struct {
	at     time.Time
	names  []string // the nodes counted, in order: a reload changes them
	counts []nodeCounts
}

type nodeCounts struct{ in, out, dead, late, duplicates int64 }

func (s *rateSamples) interval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.every <= 0 {
		s.every = rateSampleEvery
	}
	return s.every
}

// add takes a sample of the nodes' counters (in the runner's node order), and forgets the samples
// that no window needs.
func (s *rateSamples) add(now time.Time, names []string, counts []nodeCounts) {
	c := counterSample{at: now, names: names, counts: counts}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.window <= 0 {
		s.window = rateWindowSamples
	}
	s.samples = append(s.samples, c)
	if extra := len(s.samples) - (s.window + 1); extra > 0 {
		s.samples = append(s.samples[:0], s.samples[extra:]...)
	}
}

// rates computes the rates over the samples kept, from the oldest to the newest, of the nodes
// named (in the runner's node order).
func (s *rateSamples) rates(names []string) Rates {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := Rates{Nodes: make(map[string]NodeRate, len(names))}
	// Samples of other nodes than these (taken before a reload) give no rates.
	if len(s.samples) < 2 || !slices.Equal(s.samples[0].names, names) || !slices.Equal(s.samples[len(s.samples)-1].names, names) {
		for _, name := range names {
			r.Nodes[name] = NodeRate{}
		}
		return r
	}
	first, last := s.samples[0], s.samples[len(s.samples)-1]
	r.Since, r.Until = first.at, last.at
	secs := r.Seconds()
	for i, name := range names {
		a, b := first.counts[i], last.counts[i]
		r.Nodes[name] = NodeRate{In: perSecond(b.in-a.in, secs), Out: perSecond(b.out-a.out, secs),
			DeadLettered: perSecond(b.dead-a.dead, secs), Late: perSecond(b.late-a.late, secs),
			Duplicates: perSecond(b.duplicates-a.duplicates, secs)}
	}
	return r
}

// perSecond is a rate rounded to a thousandth.
func perSecond(delta int64, seconds float64) float64 {
	if delta <= 0 || seconds <= 0 {
		return 0
	}
	return math.Round(float64(delta)/seconds*1000) / 1000
}
