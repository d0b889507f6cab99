package runtime

import (
	"testing"
	"time"
)

// TestRatesComeFromSamples: a rate spans the samples kept (the last five intervals), and reading it
// changes nothing, so readers at any pace see the same rate until the next sample.
func TestRatesComeFromSamples(t *testing.T) {
	a, b := &node{name: "a"}, &node{name: "b"}
	nodes := []*node{a, b}
	var s rateSamples
	t0 := time.Unix(1000, 0)
	if r := s.rates(nodeNames(nodes)); !r.Since.IsZero() || !r.Until.IsZero() || r.Nodes["a"] != (NodeRate{}) {
		t.Fatalf("rates before any sample: %+v", r)
	}
	s.add(t0, nodeNames(nodes), sampleCounts(nodes))
	if r := s.rates(nodeNames(nodes)); !r.Since.IsZero() || r.Nodes["a"] != (NodeRate{}) {
		t.Fatalf("rates of one sample: %+v", r)
	}
	for i := 1; i <= 7; i++ {
		a.stats.count(&counts{in: 10, written: int64(i)})
		b.stats.count(&counts{deadLettered: 2})
		s.add(t0.Add(time.Duration(i)*time.Second), nodeNames(nodes), sampleCounts(nodes))
	}
	r := s.rates(nodeNames(nodes))
	if !r.Since.Equal(t0.Add(2*time.Second)) || !r.Until.Equal(t0.Add(7*time.Second)) || r.Seconds() != 5 {
		t.Fatalf("window %s to %s, want the last five seconds of samples", r.Since, r.Until)
	}
	// a wrote 3+4+5+6+7 in the window; what came before it does not count.
	if got, want := r.Nodes["a"], (NodeRate{In: 10, Out: 5}); got != want {
		t.Errorf("a: %+v, want %+v", got, want)
	}
	if got, want := r.Nodes["b"], (NodeRate{DeadLettered: 2}); got != want {
		t.Errorf("b: %+v, want %+v", got, want)
	}
	a.stats.count(&counts{in: 1000}) // after the last sample: no rate shows it before the next
	for i := 0; i < 3; i++ {
		if again := s.rates(nodeNames(nodes)); again.Nodes["a"] != r.Nodes["a"] || !again.Until.Equal(r.Until) {
			t.Fatalf("read %d: %+v, then %+v", i, r, again)
		}
	}
}

// TestRatesAfterAReload: samples of other nodes than those asked about (taken before a reload
// changed the nodes) give no rates, rather than another node's.
func TestRatesAfterAReload(t *testing.T) {
	a, b, c := &node{name: "a"}, &node{name: "b"}, &node{name: "c"}
	var s rateSamples
	t0 := time.Unix(1000, 0)
	before := []*node{a, b}
	s.add(t0, nodeNames(before), sampleCounts(before))
	b.stats.count(&counts{in: 10})
	s.add(t0.Add(time.Second), nodeNames(before), sampleCounts(before))
	after := []*node{a, c}
	if r := s.rates(nodeNames(after)); r.Nodes["c"] != (NodeRate{}) || !r.Since.IsZero() {
		t.Fatalf("rates across a reload: %+v", r)
	}
}
