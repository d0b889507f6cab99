// Package backpressure caps the backlog of topics with a max_lag: a gate per partition that
// writers (stages' commits, sources, Publish) ask before they write, and that holds them back while
// the partition's slowest reader is max_lag entries behind.
//
// It owns the gates, their estimate of the backlog and its measurement (XLEN and XINFO GROUPS
// through transport/redis). It does not write anything: writers report what they wrote or dropped,
// and say who waits (a Waiter) so that the wait shows in logs and metrics.
package backpressure

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A topic with max_lag caps the backlog of each of its partitions: the entries that its slowest
// reader (a stage or sink of the plan) has not yet processed, delivered or not. Whatever writes into
// the partition asks its gate first and waits while the backlog is at the cap, so that a slow
// consumer holds its producers back instead of filling Redis's memory.
//
// A gate does not ask Redis before every write. It keeps an estimate: the backlog as last measured,
// plus what this process has written since, plus what it has let through and not written yet; and
// it measures again (XLEN and XINFO GROUPS) when the estimate reaches the cap or is older than
// gateFreshness. Readers only ever make the backlog smaller, so the estimate is never below it. A
// writer that asks for n entries at once is let through while the estimate is under the cap, so a
// partition can pass the cap by what one writer writes in one step: nothing for a source or
// Publish, which ask per message, up to a batch for a stage, which asks per commit, or for
// PublishBatch.
// Writers in other processes are seen at the next measurement.
//
// Dead letters never wait: they are how failures become visible, and holding them back could stop
// the reader whose progress the gate waits for.

// gateFreshness is how old a gate's measurement may get before it is taken again.
const gateFreshness = time.Second

// Waiting writers measure the backlog again after gateWaitFirst, then less often, up to gateWaitMax.
const (
	gateWaitFirst = 10 * time.Millisecond
	gateWaitMax   = 200 * time.Millisecond
)

// Gates holds the gates of the capped topics' partitions, by stream key.
type Gates struct {
	rdb   *redis.Client
	clock stages.Clock
	gates map[string]*Gate
}

// New makes a gate for every partition of every topic of the plan that has a max_lag
// and a reader to wait for.
func New(rdb *redis.Client, plan *flow.Plan, keys redis.Keys, clock stages.Clock) *Gates {
	b := &Gates{rdb: rdb, clock: clock, gates: map[string]*Gate{}}
	for _, t := range plan.Topics {
		if t.MaxLag <= 0 {
			continue
		}
		var groups []string
		for _, s := range plan.Stages {
			if s.Input != nil && s.Input.Name == t.Name {
				groups = append(groups, redis.Group(s.Name))
			}
		}
		for _, s := range plan.Sinks {
			if s.Input != nil && s.Input.Name == t.Name {
				groups = append(groups, redis.Group(s.Name))
			}
		}
		if len(groups) == 0 {
			continue // nobody to wait for: validate warns that the topic is never read
		}
		for p := range t.Partitions {
			stream := keys.Stream(t.Name, p)
			b.gates[stream] = &Gate{clock: clock, topic: t.Name, partition: p, stream: stream, limit: t.MaxLag, groups: groups}
		}
	}
	return b
}

// Gate returns the gate of a stream, or nil when writing to it is not capped.
func (b *Gates) Gate(stream string) *Gate {
	if b == nil || len(b.gates) == 0 {
		return nil
	}
	return b.gates[stream]
}

// Gated returns every gate, by stream key; empty when no topic is capped.
func (b *Gates) Gated() map[string]*Gate { return b.gates }

// Gate is the cap of one partition.
type Gate struct {
	clock     stages.Clock
	topic     string
	partition int
	stream    string
	limit     int64
	groups    []string // the consumer groups of the topic's readers

	measuring sync.Mutex // one measurement at a time

	mu         sync.Mutex
	measured   int64 // the backlog, as last measured
	measuredAt time.Time
	since      int64 // written by this process since the measurement began
	unwritten  int64 // let through, not written yet
}

// Waiter is told when a writer starts and stops waiting at a gate, to make the wait visible.
type Waiter interface {
	HeldBack(g *Gate)
	Released(g *Gate, waited time.Duration)
}

// Admit waits until the partition's backlog is under its cap, then lets n entries through: the
// writer must report them written or dropped. When ctx ends first it returns ctx's error, and
// when measuring the backlog is refused for good (redis.Unrecoverable: the user may not read the
// stream's groups) that error; either way it lets nothing through (a stopping writer that writes
// anyway calls LetThrough). When the backlog cannot be measured because Redis fails, it lets the
// writer through: the write fails on its own, and is retried.
func (b *Gates) Admit(ctx context.Context, g *Gate, n int64, w Waiter) error {
	var started time.Time
	wait := gateWaitFirst
	for {
		ok, err := b.TryAdmit(ctx, g, n)
		if err != nil {
			if w != nil && !started.IsZero() {
				w.Released(g, b.clock.Now().Sub(started))
			}
			return err
		}
		if ok {
			break
		}
		if started.IsZero() {
			started = b.clock.Now()
			if w != nil {
				w.HeldBack(g)
			}
		}
		t := b.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			if w != nil {
				w.Released(g, b.clock.Now().Sub(started))
			}
			return ctx.Err()
		case <-t.C():
		}
		wait = min(2*wait, gateWaitMax)
	}
	if !started.IsZero() && w != nil {
		w.Released(g, b.clock.Now().Sub(started))
	}
	return nil
}

// TryAdmit lets n entries through if the partition has room, measuring its backlog when the
// estimate does not say; it does not wait. Its error is one that waiting does not heal.
func (b *Gates) TryAdmit(ctx context.Context, g *Gate, n int64) (bool, error) {
	if g.take(n, false) {
		return true, nil
	}
	g.measuring.Lock()
	defer g.measuring.Unlock()
	if g.take(n, false) { // measured meanwhile
		return true, nil
	}
	g.mu.Lock()
	before := g.since
	g.mu.Unlock()
	backlog, err := b.rdb.Backlog(ctx, g.stream, g.groups)
	if redis.Unrecoverable(err) {
		return false, fmt.Errorf("measuring the backlog of topic %s (max_lag): %w", g.topic, err)
	}
	if err != nil {
		g.LetThrough(n) // Redis fails: the write fails on its own, and is retried
		return true, nil
	}
	g.mu.Lock()
	// What was written while the measurement ran may or may not be in it: keep counting it.
	g.measured, g.measuredAt, g.since = backlog, b.clock.Now(), g.since-before
	g.mu.Unlock()
	return g.take(n, true), nil
}

// take lets n entries through if the estimate, fresh enough, is under the cap.
func (g *Gate) take(n int64, fresh bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !fresh && (g.measuredAt.IsZero() || g.clock.Now().Sub(g.measuredAt) > gateFreshness) {
		return false
	}
	if g.measured+g.since+g.unwritten >= g.limit {
		return false
	}
	g.unwritten += n
	return true
}

// LetThrough lets n entries through whatever the backlog.
func (g *Gate) LetThrough(n int64) {
	g.mu.Lock()
	g.unwritten += n
	g.mu.Unlock()
}

// Written reports that n entries let through are in Redis now.
func (g *Gate) Written(n int64) {
	g.mu.Lock()
	g.unwritten -= n
	g.since += n
	g.mu.Unlock()
}

// Dropped reports that n entries let through will not be written (their commit failed; they
// are let through again when they are processed again).
func (g *Gate) Dropped(n int64) {
	g.mu.Lock()
	g.unwritten -= n
	g.mu.Unlock()
}

// Topic, Partition and Limit say which partition the gate caps, and at what backlog.
func (g *Gate) Topic() string { return g.topic }

func (g *Gate) Partition() int { return g.partition }

func (g *Gate) Limit() int64 { return g.limit }
