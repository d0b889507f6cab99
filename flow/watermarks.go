package flow

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow/expr"
)

// Watermarks flow through every topic. A stateful stage decides by its input partition's watermark
// (a window closes, a key is forgotten), and that watermark is the minimum over everything that
// may still write into the partition: the sources and the stages that write the topic, each
// counting what it has committed. A source's watermark is the latest event time it has written; a
// stage that passes messages on (a filter, a map, a dedupe) passes on its input partition's
// watermark; a stage whose outputs are results of its own (an aggregate's windows) gives the least
// event time its later results can carry. A topic that nothing of the pipeline writes (other
// applications do) is measured by its readers instead: the latest event time read in the
// partition. The runtime keeps and moves the watermarks; the compiler works out, once, which
// event times each topic needs watermarks of and who writes each topic (wireWatermarks).
//
// Event time is what a stateful stage's event_time says of the message it reads, or, without one,
// the time the message's entry was first written. Every stage between a source and a stateful
// stage must leave the fields that event_time reads alone, so that the event time a source
// measured is the one the stage reads; the compiler refuses a map that changes them.

// TimeDomain is one way a pipeline reads a message's event time: a stateful stage's event_time
// expression, or the time the message's entry was first written.
type TimeDomain struct {
	// Name is the expression's source text without spaces, "" for the entry's time. Two stages whose
	// expressions read the same share a domain.
	Name string
	Expr *expr.Program // nil for the entry's time
}

// String names the domain for people.
func (d TimeDomain) String() string {
	if d.Name == "" {
		return "the entry's time"
	}
	return d.Expr.String()
}

// TopicWatermark is how a topic's partitions get their watermarks; nil on a topic that no stateful
// stage depends on.
type TopicWatermark struct {
	// Domains are the event times its readers need watermarks of, sorted by name.
	Domains []TimeDomain
	// Writers are what writes the topic: its partitions' watermarks are the least of theirs. Empty
	// when the topic is written from outside the pipeline only: its readers measure it.
	Writers []Writer
	// IdleTimeout is how long a writer goes without writing before its watermark moves with the
	// clock: the shortest idle_timeout of the stateful stages the topic feeds; 0: never.
	IdleTimeout time.Duration
}

// Writer is a source or stage that writes a topic whose watermarks are needed.
type Writer struct {
	Source *Source // a producing or stream source: one writer
	Stage  *Stage  // or a stage: one writer per partition of its input
	// SamePartition: the stage's unit on its input partition p writes only partition p of the
	// topic (it keeps the key, and the topic is unkeyed with as many partitions).
	SamePartition bool
	// Results: what it writes to the topic are new messages whose event times it sets (an
	// aggregate's results), not the messages it read.
	Results bool
}

// Name is the writer's node address, "source.NAME" or "stage.NAME".
func (w Writer) Name() string {
	if w.Source != nil {
		return "source." + w.Source.Name
	}
	return "stage." + w.Stage.Name
}

// StageWatermark is what a stage's units keep of the watermarks of their input partition; nil on
// a stage that no stateful stage depends on and that is not stateful itself.
type StageWatermark struct {
	// Domains are the event times whose watermarks its units keep, sorted by name: its own (a
	// stateful stage's event_time) and those that the readers of the topics it passes messages to
	// need.
	Domains []TimeDomain
	// Own is the index in Domains of a stateful stage's own event time; -1 for other stages.
	Own int
	// Measures: nothing of the pipeline writes the stage's input, so its units measure the
	// watermark (the latest event time read in the partition) instead of following writers.
	Measures bool
	// IdleTimeout is how long a measuring unit's input goes without entries before its watermark
	// moves with the clock; 0: never.
	IdleTimeout time.Duration
	// Delayed is the index in Domains of the event time that a delaying stage's waiting messages
	// hold back in what it passes on (Kind.Delays: a lookup's as_of); -1 for other stages.
	Delayed int
}

// Domain returns the index in Domains of the domain called name, or -1.
func (w *StageWatermark) Domain(name string) int {
	if w == nil {
		return -1
	}
	for i, d := range w.Domains {
		if d.Name == name {
			return i
		}
	}
	return -1
}

// DefaultIdleTimeout is how long an idle writer waits before its watermark moves with the clock
// when the stateful stage it feeds has no idle_timeout of its own (a dedupe stage).
const DefaultIdleTimeout = time.Minute

// The attributes that watermarks read of a stateful kind that declares them: the message's event
// time (EventTimeOf), and how long the stage's writers may be idle (DefaultIdleTimeout otherwise).
const (
	EventTimeAttribute   = "event_time"
	IdleTimeoutAttribute = "idle_timeout"
)

// EventTimeOf returns a stateful stage's event time: its event_time expression, or nil for the
// entry's time. It is nil for stages of kinds without one.
func EventTimeOf(s *Stage) *expr.Program {
	if s.Config.Declares(EventTimeAttribute) {
		return s.Config.Expr(EventTimeAttribute)
	}
	return nil
}

// domainOf is a stateful stage's own time domain: its event_time's, or, for a stage that delays
// messages (Kind.Delays), the time they wait for, which it holds back in what it passes on.
func domainOf(s *Stage) TimeDomain {
	if s.Spec != nil && s.Spec.Delays != nil {
		if by := s.Spec.Delays(s.Config); by != nil {
			return exprDomain(by)
		}
	}
	return exprDomain(EventTimeOf(s))
}

// exprDomain is the time domain of an event-time expression; nil is the entry's time.
func exprDomain(e *expr.Program) TimeDomain {
	if e == nil {
		return TimeDomain{}
	}
	return TimeDomain{Name: strings.Join(strings.Fields(e.String()), ""), Expr: e}
}

// stateful reports whether a stage keeps state per partition.
func stateful(s *Stage) bool {
	return s.Spec != nil && s.Spec.Stateful != nil && s.Spec.Stateful(s.Config)
}

// ownTime reports whether a stage reads event time by a domain of its own: a stateful stage, and
// a side of a stage with sides, which tags each message with its side's event time (sides.go).
func ownTime(s *Stage) bool {
	return stateful(s) || s.Side != ""
}

// idleTimeoutOf is how long a stateful stage lets its writers be idle before their watermarks move.
func idleTimeoutOf(s *Stage) time.Duration {
	if s.Config.Declares(IdleTimeoutAttribute) {
		return s.Config.Duration(IdleTimeoutAttribute)
	}
	return DefaultIdleTimeout
}

// resultOutputs are the topics a stage writes results of its own to: an aggregate's output, not its
// late route.
func resultOutputs(s *Stage) map[*Topic]bool {
	if s.Side != "" {
		return map[*Topic]bool{s.Output: true} // its messages carry the side's event time as their own
	}
	if s.Spec == nil || !s.Spec.Results || s.Output == nil {
		return nil
	}
	return map[*Topic]bool{s.Output: true}
}

// wireWatermarks works out which event times each topic and stage needs watermarks of, and who
// writes each topic (see above). It also refuses what would make watermarks wrong: a map that
// changes a field that a later stage's event_time reads, and ordering = "none" on a stage that
// feeds a stateful one (its units would commit out of order).
func (c *compiler) wireWatermarks(blocks map[*Stage]*Block) {
	p := c.plan
	readers := map[*Topic][]*Stage{}
	for _, s := range p.Stages {
		if s.Input != nil {
			readers[s.Input] = append(readers[s.Input], s)
		}
	}
	w := &watermarkWiring{readers: readers, need: map[*Topic]map[string]TimeDomain{}, visiting: map[*Topic]bool{},
		stageNeed: map[*Stage]map[string]TimeDomain{}, idle: map[*Topic]time.Duration{}}
	for _, t := range p.Topics {
		w.needOf(t)
	}
	writers := map[*Topic][]Writer{}
	for _, src := range p.Sources {
		if src.Output != nil {
			writers[src.Output] = append(writers[src.Output], Writer{Source: src})
		}
	}
	for _, s := range p.Stages {
		results := resultOutputs(s)
		for _, t := range s.Outputs() {
			writers[t] = append(writers[t], Writer{Stage: s, SamePartition: samePartition(s, t), Results: results[t]})
		}
	}
	for _, t := range p.Topics {
		need := w.need[t]
		if len(need) == 0 {
			continue
		}
		t.Watermark = &TopicWatermark{Domains: sortedDomains(need), Writers: writers[t], IdleTimeout: w.idleOf(t)}
	}
	for _, s := range p.Stages {
		need := w.stageNeed[s]
		if len(need) == 0 {
			continue
		}
		sw := &StageWatermark{Domains: sortedDomains(need), Own: -1, Delayed: -1}
		if ownTime(s) {
			sw.Own = sw.Domain(domainOf(s).Name)
		}
		if s.Input != nil && (s.Input.Watermark == nil || len(s.Input.Watermark.Writers) == 0) {
			sw.Measures = true
			sw.IdleTimeout = w.idleOf(s.Input)
		}
		s.Watermark = sw
		c.checkTimedStage(s, blocks[s])
		c.wireDelayingStage(s, blocks[s])
	}
}

// wireDelayingStage holds, for a stage that delays messages (Kind.Delays), the watermark it passes
// on in the event time its messages wait for at its earliest waiting message's (StageWatermark.
// Delayed), and refuses a stateful stage after it that reads its event time another way: in that
// time the messages passed on late would be judged by a watermark they are behind.
func (c *compiler) wireDelayingStage(s *Stage, b *Block) {
	if s.Spec == nil || s.Spec.Delays == nil {
		return
	}
	by := s.Spec.Delays(s.Config)
	if by == nil {
		return
	}
	held := exprDomain(by)
	s.Watermark.Delayed = s.Watermark.Domain(held.Name)
	for _, t := range s.Outputs() {
		if t.Watermark == nil {
			continue
		}
		for _, d := range t.Watermark.Domains {
			if d.Name == held.Name || b == nil {
				continue
			}
			c.errorf(b.DeclRange, "Event times differ",
				fmt.Sprintf("The %s stage %q passes a message on once its table's watermark passes the message's %s, so the "+
					"stateful stages after it (through topic %q) must read their event time the same way: one reads %s. "+
					"Give it event_time = %s, or put it before the %s stage.", s.Kind, s.Name, held, t.Name, d, held, s.Kind))
			return
		}
	}
}

// watermarkWiring is the state of wireWatermarks.
type watermarkWiring struct {
	readers   map[*Topic][]*Stage
	need      map[*Topic]map[string]TimeDomain // the domains a topic's readers need
	stageNeed map[*Stage]map[string]TimeDomain // the domains a stage's units keep
	idle      map[*Topic]time.Duration
	visiting  map[*Topic]bool // against loops through late and duplicates routes
}

// needOf returns the domains that the readers of t need watermarks of: a stateful reader its own,
// and every reader those of the topics it passes messages on to.
func (w *watermarkWiring) needOf(t *Topic) map[string]TimeDomain {
	if need, ok := w.need[t]; ok || w.visiting[t] {
		return need
	}
	w.visiting[t] = true
	defer delete(w.visiting, t)
	need := map[string]TimeDomain{}
	for _, r := range w.readers[t] {
		own := map[string]TimeDomain{}
		if ownTime(r) {
			d := domainOf(r)
			own[d.Name] = d
		}
		results := resultOutputs(r)
		for _, out := range r.Outputs() {
			if results[out] {
				continue // new messages: their event times are the stage's to give
			}
			for k, d := range w.needOf(out) {
				own[k] = d
			}
		}
		if len(own) == 0 {
			continue
		}
		if w.stageNeed[r] == nil {
			w.stageNeed[r] = map[string]TimeDomain{}
		}
		for k, d := range own {
			w.stageNeed[r][k] = d
			need[k] = d
		}
	}
	w.need[t] = need
	return need
}

// idleOf is the shortest idle timeout of the stateful stages that t feeds, by any path; 0 when none
// has one.
func (w *watermarkWiring) idleOf(t *Topic) time.Duration {
	if d, ok := w.idle[t]; ok || w.visiting[t] {
		return d
	}
	w.visiting[t] = true
	defer delete(w.visiting, t)
	var least time.Duration
	shorter := func(d time.Duration) {
		if d > 0 && (least == 0 || d < least) {
			least = d
		}
	}
	for _, r := range w.readers[t] {
		if stateful(r) {
			shorter(idleTimeoutOf(r))
		}
		for _, out := range r.Outputs() {
			shorter(w.idleOf(out))
		}
	}
	w.idle[t] = least
	return least
}

func sortedDomains(m map[string]TimeDomain) []TimeDomain {
	out := make([]TimeDomain, 0, len(m))
	for _, d := range m {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// samePartition reports whether stage s, on its input partition p, writes only partition p of t:
// t has as many partitions and no key of its own, and s keeps each message's key (flow.Kind.KeepsKey),
// or writes results keyed by what its input is partitioned by (an aggregate's, by their group).
func samePartition(s *Stage, t *Topic) bool {
	if s.Input == nil || t.Key != nil || t.Partitions != s.Input.Partitions || s.Spec == nil {
		return false
	}
	return s.Spec.Results || s.Spec.KeepsKey != nil && s.Spec.KeepsKey(s.Config)
}

// checkTimedStage refuses what would make the watermarks that stage s passes on wrong.
func (c *compiler) checkTimedStage(s *Stage, b *Block) {
	if b == nil || stateful(s) {
		return
	}
	if s.Ordering == OrderNone {
		rng := b.DeclRange
		if a, ok := b.Attributes["ordering"]; ok {
			rng = a.Expr.Range()
		}
		c.errorf(rng, "Unordered stage before a stateful one",
			fmt.Sprintf("The stage %q feeds a stateful stage, whose watermark counts what each partition's writers have "+
				"committed, in order: use ordering = \"key\" (the default) or \"partition\", not \"none\".", s.Name))
	}
	if s.Kind != "map" {
		return
	}
	var changed []string
	for _, f := range s.Config.Fields("set") {
		changed = append(changed, f.Name)
	}
	changed = append(changed, s.Config.Strings("drop")...)
	for _, d := range s.Watermark.Domains {
		fields, _ := d.Expr.Fields()
		for _, f := range fields {
			if !slices.Contains(changed, f) {
				continue
			}
			attr := "set"
			if slices.Contains(s.Config.Strings("drop"), f) {
				attr = "drop"
			}
			rng := b.DeclRange
			if a, ok := b.Attributes[attr]; ok {
				rng = a.Expr.Range()
			}
			c.errorf(rng, "A map changes the event time",
				fmt.Sprintf("The stage %q changes msg.%s, which a later stage reads as its event time (%s). The watermark that "+
					"decides when windows close is measured where messages enter the pipeline, from the fields they arrive with: "+
					"leave %s as it is and compute the event time from it in the stateful stage's event_time (such as "+
					"event_time = msg.%s * 1000), or give the new field another name.", s.Name, f, d.Expr.String(), f, f))
			return
		}
	}
}

// WatermarkRule says how a stateful stage's input partitions get their watermarks, for flowrun graph
// and validate --json.
type WatermarkRule struct {
	Stage string `json:"stage"`
	Input string `json:"input"`
	// EventTime is the stage's event time: its event_time expression, or "the entry's time".
	EventTime string `json:"event_time"`
	// Rule is "least_of_writers" (the pipeline writes the input) or "measured" (only the outside does).
	Rule string `json:"rule"`
	// Writers are the sources and stages that write the input, with how many writers each makes: a
	// source is one, a stage one per partition of its input, or only its own partition's.
	Writers []RuleWriter `json:"writers,omitempty"`
	Says    string       `json:"says"`
}

// RuleWriter is a writer of a stateful stage's input, as WatermarkRule lists it.
type RuleWriter struct {
	Node string `json:"node"`
	// PerPartition: of each partition of the input, only the stage's unit on the same partition
	// writes; otherwise each of its units writes every partition.
	PerPartition bool `json:"per_partition,omitempty"`
	Units        int  `json:"units"`
	Results      bool `json:"results,omitempty"` // it writes results of its own (an aggregate's)
}

// WatermarkRules lists the rule of every stateful stage, in the plan's order.
func (p *Plan) WatermarkRules() []WatermarkRule {
	var out []WatermarkRule
	for _, s := range p.Stages {
		if !stateful(s) || s.Watermark == nil || s.Input == nil {
			continue
		}
		r := WatermarkRule{Stage: s.Name, Input: s.Input.Name, EventTime: domainOf(s).String()}
		if s.Watermark.Measures {
			r.Rule = "measured"
			r.Says = fmt.Sprintf("Nothing of the pipeline writes %s: each partition's watermark is the latest event time read there.", describeTopic(s.Input))
			out = append(out, r)
			continue
		}
		r.Rule = "least_of_writers"
		var names []string
		for _, w := range s.Input.Watermark.Writers {
			rw := RuleWriter{Node: w.Name(), PerPartition: w.SamePartition, Units: 1, Results: w.Results}
			switch {
			case w.Stage != nil && w.SamePartition:
				names = append(names, w.Name()+" (on the same partition)")
			case w.Stage != nil:
				rw.Units = w.Stage.Input.Partitions
				names = append(names, fmt.Sprintf("%s (on each of its %d input partitions)", w.Name(), rw.Units))
			default:
				names = append(names, w.Name())
			}
			r.Writers = append(r.Writers, rw)
		}
		r.Says = fmt.Sprintf("Each partition's watermark is the least of what its writers have committed: %s.", strings.Join(names, ", "))
		out = append(out, r)
	}
	return out
}

// describeTopic names a topic for people: an implicit one by its stage.
func describeTopic(t *Topic) string {
	if t.Implicit {
		return "the output of stage " + t.Stage
	}
	return "topic " + t.Name
}
