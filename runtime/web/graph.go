package web

import (
	"encoding/json"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
)

// The graph as /api/graph serves it. Its shape (nodes, edges, layout) comes from the plan and is
// computed once; the numbers come from a Snapshot at each request.

type graphJSON struct {
	// Pipeline is the plan as Plan.Describe gives it.
	Pipeline       map[string]any `json:"pipeline"`
	Taken          time.Time      `json:"taken"`
	ElapsedSeconds float64        `json:"elapsed_seconds"`
	// Polled is when Redis was last read for lag, pending entries and dead letters; null before.
	Polled    *time.Time `json:"polled"`
	PollError string     `json:"poll_error,omitempty"`
	// RedisFailingSince is when this process's calls to Redis began to fail, while they do.
	RedisFailingSince *time.Time `json:"redis_failing_since,omitempty"`
	Ready             bool       `json:"ready"`
	NotReady          string     `json:"not_ready,omitempty"` // why not, when not ready
	Leases            int        `json:"leases"`
	Rates             rateWindow `json:"rates"`
	// History says what the nodes' history covers: a point every StepSeconds, Points of them
	// (none before the process has run for a step, or when the pipeline keeps none).
	History historyJSON `json:"history"`
	Layout  layoutSize  `json:"layout"`
	Nodes   []nodeJSON  `json:"nodes"`
	Edges   []edgeJSON  `json:"edges"`
}

// rateWindow is the interval that the edges' rates are measured over: between two of the samples
// of the counters that the runtime takes every second, the last one and one about five seconds
// before. Since and Until are null, and every rate 0, until there are two samples.
type rateWindow struct {
	Since   *time.Time `json:"since"`
	Until   *time.Time `json:"until"`
	Seconds float64    `json:"seconds"`
}

type historyJSON struct {
	StepSeconds float64    `json:"step_seconds"`
	Points      int        `json:"points"`
	Since       *time.Time `json:"since"`
	Until       *time.Time `json:"until"`
}

// nodeHistoryJSON is a node's history: the messages it took in per second over each step, and its
// input's lag as of each point (null where it was not known).
type nodeHistoryJSON struct {
	Rate []float64 `json:"rate"`
	Lag  []*int64  `json:"lag"`
}

// deadLetterJSON is one of a node's latest dead letters.
type deadLetterJSON struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

type layoutSize struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

type nodeJSON struct {
	ID     string `json:"id"`   // the address: source.NAME, topic.NAME, stage.NAME or sink.NAME
	Type   string `json:"type"` // source, topic, stage or sink
	Name   string `json:"name"`
	Kind   string `json:"kind,omitempty"` // the source's, stage's or sink's kind
	Detail string `json:"detail"`         // a short description: "map stage", "4 partitions"
	// Layer is the node's depth in the graph, and Band the row of layers it is drawn in (a long
	// pipeline's layers are cut into bands, one below the other); X and Y (its top left corner),
	// Width and Height place it in a drawing of Layout's size.
	Layer  int `json:"layer"`
	Band   int `json:"band"`
	X      int `json:"x"`
	Y      int `json:"y"`
	Width  int `json:"width"`
	Height int `json:"height"`

	// Sources, stages and sinks: their counters since this process started (absent when this
	// process does not run the node), the length of their own dead-letter stream, and the topic
	// their dead letters go to instead, if they name one. Stateful marks a stage whose kind keeps
	// state (aggregate, dedupe, a stateful go function): its counters include late and duplicates,
	// its box shows them with dropped and absorbed, and it has a Watermark.
	Stateful        bool          `json:"stateful,omitempty"`
	Counters        *countersJSON `json:"counters,omitempty"`
	DeadLetters     *int64        `json:"dead_letters,omitempty"`
	DeadLetterTopic string        `json:"dead_letter_topic,omitempty"`
	// LastDeadLetters are the latest five dead letters that this process made of the node's
	// messages, newest first, with their reasons.
	LastDeadLetters []deadLetterJSON `json:"last_dead_letters,omitempty"`
	// History is the last 15 minutes of the node's rate and input lag, as this process saw them.
	History *nodeHistoryJSON `json:"history,omitempty"`
	// Progress is a producing source's (generate, file, stdin).
	Progress *progressJSON `json:"progress,omitempty"`
	// Stream is a redis_stream source's input, as of the last poll, when this process runs it.
	Stream *streamJSON `json:"stream,omitempty"`
	// Paused is set while the node's attempts fail transiently: it waits for its downstream.
	Paused *pausedJSON `json:"paused,omitempty"`
	// HeldBackBy names the topic at its max_lag that the node waits for, while it does;
	// HeldBackSeconds is how long its writers waited for capped topics, in all.
	HeldBackBy      string  `json:"held_back_by,omitempty"`
	HeldBackSeconds float64 `json:"held_back_seconds,omitempty"`
	// Delaying counts the node's messages that wait now because its kind delayed them (a rate
	// limit); DelayedSeconds is how long its messages waited so, in all.
	Delaying       int     `json:"delaying,omitempty"`
	DelayedSeconds float64 `json:"delayed_seconds,omitempty"`
	// Watermark is a stateful stage's own watermark per partition of its input, as of the last
	// poll, when this process runs the stage.
	Watermark *watermarkJSON `json:"watermark,omitempty"`

	// Topics: the partitions, the key expression and each partition's length as far as the nodes
	// that this process runs read it.
	Partitions       int               `json:"partitions,omitempty"`
	Key              string            `json:"key,omitempty"`
	PartitionLengths []partitionLength `json:"partition_lengths,omitempty"`
}

// countersJSON are a node's counters (runtime.NodeSummary). The outcomes add up: in = out +
// filtered + dropped + absorbed + dead_lettered + in_flight; written, failed_attempts, retries, late
// and duplicates are no outcomes.
type countersJSON struct {
	In           int64 `json:"in"`
	Out          int64 `json:"out"`
	Filtered     int64 `json:"filtered"`
	Dropped      int64 `json:"dropped"`
	Absorbed     int64 `json:"absorbed"`
	DeadLettered int64 `json:"dead_lettered"`
	InFlight     int64 `json:"in_flight"`
	// Written counts entries written to topics (a sink: deliveries); FailedAttempts and Retries
	// count attempts.
	Written        int64 `json:"written"`
	FailedAttempts int64 `json:"failed_attempts"`
	Retries        int64 `json:"retries"`
	// A stateful stage's: the messages it found late or repeated, whatever became of them.
	Late       *int64 `json:"late,omitempty"`
	Duplicates *int64 `json:"duplicates,omitempty"`
}

type pausedJSON struct {
	Since  time.Time `json:"since"`
	Reason string    `json:"reason"` // the last transient failure
}

type progressJSON struct {
	Produced int64 `json:"produced"`
	Total    int64 `json:"total,omitempty"` // absent when the source cannot tell
	Done     bool  `json:"done"`
	// UpstreamLag is what a source reading another system last reported of the messages that
	// system still holds for it (absent when it reports none).
	UpstreamLag *int64 `json:"upstream_lag,omitempty"`
}

// streamJSON is the stream a redis_stream source reads, with the lag and pending entries of the
// source's consumer group.
type streamJSON struct {
	Stream  string `json:"stream"`
	Length  int64  `json:"length"`
	Lag     int64  `json:"lag"`
	Pending int64  `json:"pending"`
}

// watermarkJSON is a stateful stage's own watermark (event time) in each partition of its input
// topic, as committed with its state: what flowrun inspect --state shows. A lag is the time taken
// (the runtime's clock) less a watermark; it is negative where event times run ahead of the clock.
// Least is the earliest watermark of the partitions that have one, the one furthest behind, and
// LagSeconds its lag; both are null until a partition has one.
type watermarkJSON struct {
	Topic      string                   `json:"topic"`
	Least      *time.Time               `json:"least"`
	LagSeconds *float64                 `json:"lag_seconds"`
	Partitions []partitionWatermarkJSON `json:"partitions"`
}

// partitionWatermarkJSON is one partition's watermark; null (and its lag null) before it has one.
type partitionWatermarkJSON struct {
	Partition  int        `json:"partition"`
	Watermark  *time.Time `json:"watermark"`
	LagSeconds *float64   `json:"lag_seconds"`
}

type partitionLength struct {
	Partition int   `json:"partition"`
	Length    int64 `json:"length"`
}

type edgeJSON struct {
	From string `json:"from"`
	To   string `json:"to"`
	Kind string `json:"kind"` // reads, writes, side_output, dead_letter, or lookup (a table's stage to a lookup stage)
	// Label is a route case's condition, "default", or a side output's attribute: "late",
	// "duplicates".
	Label string `json:"label,omitempty"`
	Topic string `json:"topic"` // the topic the edge carries
	// Implicit marks an edge drawn straight from a stage to a reader of its implicit output topic.
	Implicit bool `json:"implicit,omitempty"`
	// Fused marks an edge inside a fused chain: its messages pass in memory, not through a stream.
	Fused bool `json:"fused,omitempty"`
	// Points is the line to draw, [x, y] pairs from the source's box to the target's: two for an
	// edge between neighbouring layers (drawn as a curve), more for one that runs along a lane
	// below the boxes. LabelAt is where its numbers go.
	Points  [][2]int `json:"points"`
	LabelAt [2]int   `json:"label_at"`
	// Rate is messages per second over Rates: a reads edge counts what its reader read, a writes
	// edge what its writer wrote (but for its side outputs), a side_output edge the late events or
	// duplicates its stage found, a dead_letter edge what its node dead-lettered. Null where this
	// process cannot tell (it does not run the node; a route stage's outputs share one count; a
	// side output of a kind that counts none).
	Rate *float64 `json:"rate"`
	// Lag, Pending and Retries are summed over the reading node's partitions (reads edges of
	// nodes this process runs; null otherwise), and Partitions lists them one by one. An edge
	// inside a fused chain has none: 0, with no partitions.
	Lag        *int64          `json:"lag"`
	Pending    *int64          `json:"pending"`
	Retries    *int64          `json:"retries"`
	Partitions []partitionJSON `json:"partitions"`
}

type partitionJSON struct {
	Partition int   `json:"partition"`
	Length    int64 `json:"length"`
	Lag       int64 `json:"lag"`
	Pending   int64 `json:"pending"`
	Retries   int64 `json:"retries"`
}

// nodeRate is one of a node's rates, by the name of its counter (countIn, ...).
func nodeRate(r runtime.NodeRate, count string) float64 {
	switch count {
	case countIn:
		return r.In
	case countOut:
		return r.Out
	case countDeadLettered:
		return r.DeadLettered
	case countLate:
		return r.Late
	case countDuplicates:
		return r.Duplicates
	}
	return 0
}

// historian is a Pipeline that keeps a history of its nodes (*runtime.Runtime does).
type historian interface {
	History() runtime.History
}

// graphHandler serves /api/graph.
type graphHandler struct {
	rt       Pipeline
	plan     *flow.Plan
	pipeline map[string]any
	view     graphView
}

func newGraphHandler(rt Pipeline) *graphHandler {
	p := rt.Plan()
	return &graphHandler{rt: rt, plan: p, pipeline: p.Describe(), view: newGraphView(p)}
}

func (g *graphHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s := g.rt.Snapshot()
	ready := g.rt.Ready()
	var hist runtime.History
	if keeper, ok := g.rt.(historian); ok {
		hist = keeper.History()
	}
	body, err := json.Marshal(g.describe(s, ready, hist))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(body)
}

// describe combines the graph's shape with a snapshot and the nodes' history.
func (g *graphHandler) describe(s runtime.Snapshot, ready error, h runtime.History) graphJSON {
	counters := map[string]runtime.NodeSummary{}
	for _, n := range s.Nodes {
		counters[n.Name] = n
	}
	progress := map[string]runtime.SourceProgress{}
	for _, p := range s.Sources {
		progress[p.Name] = p
	}
	partitions := map[string][]runtime.PartitionState{}  // by reading node
	lengths := map[string]map[int]int64{}                // by topic, then partition
	sourceStreams := map[string]runtime.PartitionState{} // by redis_stream source
	for _, p := range s.Partitions {
		if p.Topic == "" {
			sourceStreams[p.Node] = p
			continue
		}
		partitions[p.Node] = append(partitions[p.Node], p)
		if lengths[p.Topic] == nil {
			lengths[p.Topic] = map[int]int64{}
		}
		if _, seen := lengths[p.Topic][p.Partition]; !seen {
			lengths[p.Topic][p.Partition] = p.Length
		}
	}
	rates := s.Rates

	out := graphJSON{
		Pipeline:       g.pipeline,
		Taken:          s.Taken,
		ElapsedSeconds: s.Elapsed.Seconds(),
		Ready:          ready == nil,
		Leases:         s.Leases,
		Layout:         layoutSize{Width: g.view.width, Height: g.view.height},
		Nodes:          make([]nodeJSON, 0, len(g.view.nodes)),
		Edges:          make([]edgeJSON, 0, len(g.view.edges)),
	}
	if !s.Polled.IsZero() {
		out.Polled = &s.Polled
	}
	if s.PollErr != nil {
		out.PollError = g.plan.Redact(s.PollErr.Error())
	}
	if !s.RedisFailingSince.IsZero() {
		since := s.RedisFailingSince
		out.RedisFailingSince = &since
	}
	if ready != nil {
		out.NotReady = g.plan.Redact(ready.Error())
	}
	if !rates.Since.IsZero() {
		out.Rates = rateWindow{Since: &rates.Since, Until: &rates.Until, Seconds: rates.Seconds()}
	}
	out.History = historyJSON{StepSeconds: h.Step.Seconds(), Points: len(h.Times)}
	if len(h.Times) > 0 {
		out.History.Since, out.History.Until = &h.Times[0], &h.Times[len(h.Times)-1]
	}

	for _, vn := range g.view.nodes {
		n := nodeJSON{
			ID: vn.id, Type: vn.typ, Name: vn.name, Kind: vn.kind, Detail: vn.detail,
			Layer: vn.layer, Band: vn.layer / max(1, g.view.perBand), X: vn.x, Y: vn.y, Width: vn.width, Height: vn.height,
			DeadLetterTopic: vn.deadLetterTopic, Partitions: vn.partitions, Key: vn.key, Stateful: vn.stateful,
		}
		if c, ok := counters[vn.name]; ok && vn.typ != "topic" {
			n.Counters = &countersJSON{In: c.In, Out: c.Out, Filtered: c.Filtered, Dropped: c.Dropped, Absorbed: c.Absorbed,
				DeadLettered: c.DeadLettered, InFlight: c.InFlight,
				Written: c.Written, FailedAttempts: c.FailedAttempts, Retries: c.Retries}
			if vn.stateful {
				n.Counters.Late, n.Counters.Duplicates = &c.Late, &c.Duplicates
			}
			if !c.PausedSince.IsZero() {
				n.Paused = &pausedJSON{Since: c.PausedSince, Reason: g.plan.Redact(c.PausedBy)}
			}
			n.HeldBackBy, n.HeldBackSeconds = c.HeldBackBy, c.HeldBack.Seconds()
			n.Delaying, n.DelayedSeconds = c.Delaying, c.Delayed.Seconds()
			for _, d := range c.LastDeadLetters {
				n.LastDeadLetters = append(n.LastDeadLetters, deadLetterJSON{At: d.At, Reason: g.plan.Redact(d.Reason)})
			}
		}
		if nh, ok := h.Nodes[vn.name]; ok && vn.typ != "topic" {
			n.History = historyOf(nh)
		}
		if d, ok := s.DeadLetters[vn.name]; ok && vn.typ != "topic" {
			n.DeadLetters = &d
		}
		if p, ok := progress[vn.name]; ok && vn.typ == "source" {
			n.Progress = &progressJSON{Produced: p.Produced, Total: p.Total, Done: p.Done}
			if p.UpstreamLag >= 0 {
				n.Progress.UpstreamLag = &p.UpstreamLag
			}
		}
		if p, ok := sourceStreams[vn.name]; ok && vn.typ == "source" {
			n.Stream = &streamJSON{Stream: p.Stream, Length: p.Length, Lag: p.Lag, Pending: p.Pending}
		}
		if parts, ok := partitions[vn.name]; ok && vn.stateful {
			n.Watermark = watermarkOf(parts, s.Taken)
		}
		if vn.typ == "topic" {
			for part, length := range lengths[vn.name] {
				n.PartitionLengths = append(n.PartitionLengths, partitionLength{Partition: part, Length: length})
			}
			sort.Slice(n.PartitionLengths, func(i, j int) bool {
				return n.PartitionLengths[i].Partition < n.PartitionLengths[j].Partition
			})
		}
		out.Nodes = append(out.Nodes, n)
	}

	for _, ve := range g.view.edges {
		e := edgeJSON{From: ve.from, To: ve.to, Kind: ve.kind, Label: ve.label, Topic: ve.topic, Implicit: ve.implicit, Fused: ve.fused,
			Points: ve.points, LabelAt: ve.labelAt}
		if _, ok := counters[ve.counted]; ok && ve.counted != "" {
			nr := rates.Nodes[ve.counted]
			r := nodeRate(nr, ve.count)
			for _, c := range ve.less {
				r -= nodeRate(nr, c)
			}
			r = max(0, math.Round(r*1000)/1000) // the counters are sampled one after another
			e.Rate = &r
		}
		if ve.reader != "" {
			if parts, ok := partitions[ve.reader]; ok {
				var lag, pending, retries int64
				e.Partitions = make([]partitionJSON, 0, len(parts))
				for _, p := range parts {
					lag, pending, retries = lag+p.Lag, pending+p.Pending, retries+p.Retries
					e.Partitions = append(e.Partitions, partitionJSON{
						Partition: p.Partition, Length: p.Length, Lag: p.Lag, Pending: p.Pending, Retries: p.Retries,
					})
				}
				sort.Slice(e.Partitions, func(i, j int) bool { return e.Partitions[i].Partition < e.Partitions[j].Partition })
				e.Lag, e.Pending, e.Retries = &lag, &pending, &retries
			}
		}
		if _, runs := counters[ve.counted]; ve.fused && runs && e.Lag == nil {
			// Inside a fused chain nothing waits between the stages: it passes in memory.
			var none int64
			e.Lag, e.Pending, e.Retries, e.Partitions = &none, &none, &none, []partitionJSON{}
		}
		out.Edges = append(out.Edges, e)
	}
	return out
}

// historyOf gives a node's history, a lag that was not known as null.
func historyOf(nh runtime.NodeHistory) *nodeHistoryJSON {
	out := &nodeHistoryJSON{Rate: make([]float64, len(nh.Rate)), Lag: make([]*int64, len(nh.Lag))}
	for i, r := range nh.Rate {
		out.Rate[i] = math.Round(r*1000) / 1000
	}
	for i := range nh.Lag {
		if nh.Lag[i] >= 0 {
			out.Lag[i] = &nh.Lag[i]
		}
	}
	return out
}

// watermarkOf gives a stateful stage's watermarks from the polled states of its input partitions,
// with their lags as of taken.
func watermarkOf(parts []runtime.PartitionState, taken time.Time) *watermarkJSON {
	lagOf := func(at time.Time) *float64 {
		lag := math.Round(taken.Sub(at).Seconds()*1000) / 1000
		return &lag
	}
	w := &watermarkJSON{Partitions: make([]partitionWatermarkJSON, 0, len(parts))}
	for _, p := range parts {
		w.Topic = p.Topic
		pw := partitionWatermarkJSON{Partition: p.Partition}
		if !p.Watermark.IsZero() {
			at := p.Watermark
			pw.Watermark, pw.LagSeconds = &at, lagOf(at)
			if w.Least == nil || at.Before(*w.Least) {
				w.Least = &at
			}
		}
		w.Partitions = append(w.Partitions, pw)
	}
	if w.Least != nil {
		w.LagSeconds = lagOf(*w.Least)
	}
	sort.Slice(w.Partitions, func(i, j int) bool { return w.Partitions[i].Partition < w.Partitions[j].Partition })
	return w
}
