package runtime

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Summary is what a run did, node by node.
type Summary struct {
	Elapsed time.Duration
	Nodes   []NodeSummary // sources, stages and sinks, in the plan's order
}

// NodeSummary counts what one source, stage or sink did.
type NodeSummary struct {
	Name string
	Type string // "source", "stage" or "sink"
	Kind string
	// In counts entries read (for a producing source: messages produced); Out entries written to
	// topics and streams; Filtered messages that passed nothing on by design (a filter, a route
	// without default, a sink's where).
	In, Out, Filtered int64
	// Failed counts failed attempts, Retried attempts made again, DeadLettered messages given up.
	Failed, Retried, DeadLettered int64
	// HeldBack is how long the node's writers waited for topics at their max_lag, in all;
	// HeldBackBy names the topic one of them waits for now ("" when none waits).
	HeldBack   time.Duration
	HeldBackBy string
	// PausedSince is when the node's attempts began to fail transiently (its downstream went
	// away), while they do; PausedBy is the last such failure. Zero and "" otherwise.
	PausedSince time.Time
	PausedBy    string
}

// DeadLettered is the number of messages the run sent to dead-letter streams.
func (s *Summary) DeadLettered() int64 {
	var n int64
	for _, ns := range s.Nodes {
		n += ns.DeadLettered
	}
	return n
}

func (r *runner) summary() *Summary {
	return &Summary{Elapsed: time.Since(time.Unix(0, r.started.Load())), Nodes: r.nodeSummaries()}
}

// nodeSummaries reads every node's counters.
func (r *runner) nodeSummaries() []NodeSummary {
	out := make([]NodeSummary, 0, len(r.nodes))
	for _, n := range r.nodes {
		ns := NodeSummary{
			Name: n.name, Type: n.typ, Kind: n.kind,
			In: n.stats.in.Load(), Out: n.stats.out.Load(), Filtered: n.stats.filtered.Load(),
			Failed: n.stats.failed.Load(), Retried: n.stats.retried.Load(), DeadLettered: n.stats.deadLettered.Load(),
			HeldBack: time.Duration(n.stats.heldBack.Load()),
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

// Write prints the summary as a table.
func (s *Summary) Write(w io.Writer) error {
	secs := s.Elapsed.Seconds()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "node\tkind\tin\tout\tfiltered\tfailed\tretried\tdead-lettered\tin/s\t\n")
	for _, n := range s.Nodes {
		rate := "-"
		if secs > 0 {
			rate = fmt.Sprintf("%.0f", float64(n.In)/secs)
		}
		fmt.Fprintf(tw, "%s.%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
			n.Type, n.Name, n.Kind, n.In, n.Out, n.Filtered, n.Failed, n.Retried, n.DeadLettered, rate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "elapsed %s; %d dead-lettered\n", s.Elapsed.Round(time.Millisecond), s.DeadLettered())
	return err
}
