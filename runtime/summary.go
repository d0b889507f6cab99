package runtime

import (
	"time"
)

// Summary is what a run did, node by node.
type Summary struct {
	Elapsed time.Duration
	Nodes   []NodeSummary // sources, stages and sinks, in the plan's order
	// Path is the pipeline's path as the user gave it (Options.PipelinePath), for the commands that
	// the summary suggests.
	Path string
	// Ephemeral says that the dead letters do not outlive the process (an embedded Redis), so that
	// no command can list them later: flowrun run then prints DeadLetters, one per line, instead.
	Ephemeral   bool
	DeadLetters []DeadLetter
}

// NodeSummary counts what one source, stage or sink did.
type NodeSummary struct {
	Name string
	Type string // "source", "stage" or "sink"
	Kind string
	// In counts entries read (for a producing source: messages produced); Out entries written to
	// topics and streams (for a sink: messages delivered); Filtered messages that passed nothing on
	// by design (a filter, a route without default, a sink's where).
	In, Out, Filtered int64
	// Failed counts failed attempts, Retried attempts made again, DeadLettered messages given up.
	Failed, Retried, DeadLettered int64
	// Late and Duplicates count what a stateful stage found late (an aggregate's event for closed
	// windows) or repeated (a dedupe's duplicate), whatever became of it: routed to a topic,
	// dead-lettered or dropped. Dropped counts those of them it passed on nowhere (late = "drop",
	// duplicates = "drop"), which Filtered counts too.
	Late, Duplicates, Dropped int64
	// HeldBack is how long the node's writers waited for topics at their max_lag, in all;
	// HeldBackBy names the topic one of them waits for now ("" when none waits).
	HeldBack   time.Duration
	HeldBackBy string
	// PausedSince is when the node's attempts began to fail transiently (its downstream went
	// away), while they do; PausedBy is the last such failure. Zero and "" otherwise.
	PausedSince time.Time
	PausedBy    string
	// Reasons are the first few distinct reasons why messages were dead-lettered, in the order they
	// first happened, with how many had each; DeadLettered counts those with other reasons too.
	Reasons []DeadLetterReason
}

// DeadLettered is the number of messages the run sent to dead-letter streams.
func (s *Summary) DeadLettered() int64 {
	var n int64
	for _, ns := range s.Nodes {
		n += ns.DeadLettered
	}
	return n
}

// summary is taken once every worker has stopped, so the dead-letter warnings still held back by
// the rate limit are logged first: nothing dead-lettered later could join them.
func (r *runner) summary() *Summary {
	r.obs.deadLetters.flush(r.log, r.opts.PipelinePath, r.clock.Now(), true)
	return &Summary{Elapsed: r.clock.Now().Sub(time.Unix(0, r.started.Load())), Nodes: r.nodeSummaries(), Path: r.opts.PipelinePath}
}

// nodeSummaries reads every node's counters.
func (r *runner) nodeSummaries() []NodeSummary {
	out := make([]NodeSummary, 0, len(r.nodes))
	for _, n := range r.nodes {
		ns := NodeSummary{
			Name: n.name, Type: n.typ, Kind: n.kind,
			In: n.stats.in.Load(), Out: n.stats.out.Load(), Filtered: n.stats.filtered.Load(),
			Failed: n.stats.failed.Load(), Retried: n.stats.retried.Load(), DeadLettered: n.stats.deadLettered.Load(),
			Late: n.stats.late.Load(), Duplicates: n.stats.duplicates.Load(), Dropped: n.stats.dropped.Load(),
			HeldBack: time.Duration(n.stats.heldBack.Load()), Reasons: r.obs.deadLetters.reasons(n.name),
		}
		if by := n.stats.heldBy.Load(); by != nil && n.stats.holding.Load() > 0 {
			ns.HeldBackBy = *by
		}
		if n.breaker != nil {
			if since, why, paused := n.breaker.pausedSince(); paused {
				ns.PausedSince, ns.PausedBy = since, why
			}
		}
		out = append(out, ns)
	}
	return out
}
