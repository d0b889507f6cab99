package flowtest

import (
	"bytes"
	"context"
	"slices"
	"sort"
	"time"

	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// What a run saw: everything is measured from a mark taken when the run began, so that a run's
// expectations are about the run alone, although runs share Redis and the pipeline.

// counters are a node's counters, as an assert reads them (metrics.NODE.COUNTER).
type counters struct {
	in, out, filtered, dropped, absorbed, deadLettered, inFlight int64
	written, failedAttempts, retries, late, duplicates           int64
}

func (c counters) plus(o counters) counters {
	return counters{c.in + o.in, c.out + o.out, c.filtered + o.filtered, c.dropped + o.dropped, c.absorbed + o.absorbed,
		c.deadLettered + o.deadLettered, c.inFlight + o.inFlight,
		c.written + o.written, c.failedAttempts + o.failedAttempts, c.retries + o.retries, c.late + o.late, c.duplicates + o.duplicates}
}

func (c counters) minus(o counters) counters {
	return counters{c.in - o.in, c.out - o.out, c.filtered - o.filtered, c.dropped - o.dropped, c.absorbed - o.absorbed,
		c.deadLettered - o.deadLettered, c.inFlight - o.inFlight,
		c.written - o.written, c.failedAttempts - o.failedAttempts, c.retries - o.retries, c.late - o.late, c.duplicates - o.duplicates}
}

// values are the counters by the names an assert reads them by (testfile.Counters).
func (c counters) values() map[string]int64 {
	return map[string]int64{
		"in": c.in, "out": c.out, "filtered": c.filtered, "dropped": c.dropped, "absorbed": c.absorbed,
		"dead_lettered": c.deadLettered, "in_flight": c.inFlight,
		"written": c.written, "failed_attempts": c.failedAttempts, "retries": c.retries,
		"late": c.late, "duplicates": c.duplicates,
	}
}

// values are the counters by every name an assert may read them by, older ones too
// (testfile.CounterAliases).
func (c counters) valuesByAnyName() map[string]int64 {
	v := c.values()
	for old, name := range testfile.CounterAliases {
		v[old] = v[name]
	}
	return v
}

// countersOf reads the counters of a snapshot's nodes, by "type.name".
func countersOf(nodes []runtime.NodeSummary) map[string]counters {
	out := make(map[string]counters, len(nodes))
	for _, n := range nodes {
		out[n.Type+"."+n.Name] = counters{n.In, n.Out, n.Filtered, n.Dropped, n.Absorbed, n.DeadLettered, n.InFlight,
			n.Written, n.FailedAttempts, n.Retries, n.Late, n.Duplicates}
	}
	return out
}

// mark is where a run began.
type mark struct {
	captured    map[string]int    // messages each sink had received
	topics      map[string]string // the last entry ID of each topic partition's stream
	deadLetters map[string]bool   // the dead letters there were, by stream and ID
	counters    map[string]counters
	dropped     int // messages dropped so far (harness.dropped)
}

// counters returns every node's counters so far, the dead incarnations' included.
func (h *harness) counters() map[string]counters {
	out := map[string]counters{}
	for name, c := range h.finished {
		out[name] = c
	}
	for name, c := range countersOf(h.live.rt.Snapshot().Nodes) {
		out[name] = out[name].plus(c)
	}
	return out
}

// mark takes the mark of a run that begins now.
func (h *harness) mark(ctx context.Context) (*mark, error) {
	m := &mark{captured: h.captured.counts(), topics: map[string]string{}, deadLetters: map[string]bool{}, counters: h.counters(),
		dropped: len(h.droppedSince(0))}
	keys := redis.Keys{Prefix: h.plan.KeyPrefix}
	for _, t := range h.plan.Topics {
		for _, stream := range keys.Streams(t.Name, t.Partitions) {
			st, err := h.live.client.StreamStats(ctx, stream)
			if err != nil {
				return nil, err
			}
			m.topics[stream] = st.LastID
		}
	}
	dls, err := h.deadLetters(ctx)
	if err != nil {
		return nil, err
	}
	for _, dl := range dls {
		m.deadLetters[dl.Stream+"/"+dl.ID] = true
	}
	return m, nil
}

// seen is what a run saw since its mark.
type seen struct {
	arrivals    map[string][]Arrived // by "sink.NAME" and "topic.NAME"
	deadLetters []DeadLetter
	counters    map[string]counters // by "type.name"
	dropped     []Dropped
	waiting     []Waiting
}

// observe collects what arrived since m.
func (h *harness) observe(ctx context.Context, m *mark) (*seen, error) {
	s := &seen{arrivals: map[string][]Arrived{}, counters: map[string]counters{}}
	for _, sink := range h.plan.Sinks {
		name := "sink." + sink.Name
		s.arrivals[name] = h.captured.since(name, m.captured[name])
	}
	keys := redis.Keys{Prefix: h.plan.KeyPrefix}
	for _, t := range h.plan.Topics {
		name := "topic." + t.Name
		s.arrivals[name] = []Arrived{}
		for _, stream := range keys.Streams(t.Name, t.Partitions) {
			after := m.topics[stream]
			if after == "" {
				after = "0"
			}
			for {
				recs, err := h.live.client.Read(ctx, stream, after, 1000, 0)
				if err != nil {
					return nil, err
				}
				if len(recs) == 0 {
					break
				}
				for _, rec := range recs {
					if rec.Malformed == nil {
						s.arrivals[name] = append(s.arrivals[name], Arrived{Key: rec.Key, Payload: bytes.Clone(rec.Payload), Where: name})
					}
				}
				after = recs[len(recs)-1].ID
			}
		}
	}
	dls, err := h.deadLetters(ctx)
	if err != nil {
		return nil, err
	}
	for _, dl := range dls {
		if m.deadLetters[dl.Stream+"/"+dl.ID] {
			continue
		}
		s.deadLetters = append(s.deadLetters, DeadLetter{
			Node: dl.Envelope.NodeType + "." + dl.Envelope.Node, Key: dl.Envelope.Key, Payload: dl.Envelope.Payload,
			Reason: dl.Envelope.Error, Attempts: dl.Envelope.Attempts,
		})
	}
	for name, c := range h.counters() {
		s.counters[name] = c.minus(m.counters[name])
	}
	s.dropped = h.droppedSince(m.dropped)
	if s.waiting, err = h.timersWaiting(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// recordDropped is runtime.Options.Dropped: it keeps what the stateful stages dropped, for the
// report of a failure.
func (h *harness) recordDropped(stage, key string, payload []byte, why string) {
	h.drops.Lock()
	defer h.drops.Unlock()
	h.drops.list = append(h.drops.list, Dropped{Node: "stage." + stage, Key: key, Payload: bytes.Clone(payload), Why: why})
}

// droppedSince returns the messages dropped after the first n.
func (h *harness) droppedSince(n int) []Dropped {
	h.drops.Lock()
	defer h.drops.Unlock()
	if n >= len(h.drops.list) {
		return nil
	}
	return slices.Clone(h.drops.list[n:])
}

// timersWaiting reads, for each stateful stage's partition that has timers set, its watermark and next
// timer: what a window that has not fired waits for.
func (h *harness) timersWaiting(ctx context.Context) ([]Waiting, error) {
	var out []Waiting
	keys := redis.Keys{Prefix: h.plan.KeyPrefix}
	for _, st := range h.plan.Stages {
		kind, err := stages.StageKindOf(st)
		if err != nil || !kind.TraitsFor(st.Config).Stateful {
			continue
		}
		for p := range st.Input.Partitions {
			info, err := h.live.client.StateStats(ctx, keys.State(st.Input.Name, p, st.Name), keys.Timers(st.Input.Name, p, st.Name))
			if err != nil {
				return nil, err
			}
			if info.Timers == 0 {
				continue
			}
			w := Waiting{Node: "stage." + st.Name, Partition: p, Timers: info.Timers, NextTimer: time.UnixMilli(info.NextTimer).UTC()}
			if info.Watermark > 0 {
				w.Watermark = time.UnixMilli(info.Watermark).UTC()
			}
			out = append(out, w)
		}
	}
	return out, nil
}

// deadLetters lists every dead letter of every node, oldest first per node.
func (h *harness) deadLetters(ctx context.Context) ([]runtime.DeadLetter, error) {
	var all []runtime.DeadLetter
	seenStream := map[string]bool{}
	for _, name := range nodeNames(h) {
		d, err := admin.OpenDeadLetters(h.live.client, h.plan, name)
		if err != nil {
			return nil, err
		}
		dls, err := d.List(ctx)
		if err != nil {
			return nil, err
		}
		for _, dl := range dls {
			// A dead_letter topic holds the dead letters of several nodes: count each once, for its node.
			if dl.Envelope.Node != name || seenStream[dl.Stream+"/"+dl.ID] {
				continue
			}
			seenStream[dl.Stream+"/"+dl.ID] = true
			all = append(all, dl)
		}
	}
	return all, nil
}

func nodeNames(h *harness) []string {
	var names []string
	for _, s := range h.plan.Sources {
		names = append(names, s.Name)
	}
	for _, s := range h.plan.Stages {
		names = append(names, s.Name)
	}
	for _, s := range h.plan.Sinks {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names
}
