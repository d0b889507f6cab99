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

// NodeSummary counts what one source, stage or sink did. Its counts add up (outcomes.go): every
// message it took in (In) ended in exactly one outcome, or is still in flight,
//
//	In = Out + Filtered + Dropped + Absorbed + DeadLettered + InFlight
//
// each counted once, when the batch that settled the message was committed.
type NodeSummary struct {
	Name string
	Type string // "source", "stage" or "sink"
	Kind string
	// In counts the messages the node took in: entries read from its input (malformed ones too),
	// dead letters replayed to it; for a producing source, the messages its kind produced (Redis
	// has them).
	In int64
	// Out counts those passed on: that produced at least one output (a sink: delivered; a source:
	// written to its topic).
	Out int64
	// Filtered counts those that produced nothing, by design (a filter, a route without default, a
	// sink's where); Dropped those that a stateful stage found late or repeated and passed on
	// nowhere (late = "drop", duplicates = "drop"); Absorbed those that a windowed stage (an
	// aggregate) took into its windows, whose results come from its timers.
	Filtered, Dropped, Absorbed int64
	// DeadLettered counts those that failed for good or could not be read (a source: rejected).
	DeadLettered int64
	// InFlight counts those taken in and not settled yet: waiting in the node's retry set for a
	// later attempt. It is 0 once a job is done, but for a message parked by one process and
	// settled by another, which counts in in one and its outcome in the other.
	InFlight int64

	// Not outcomes of a message. Written counts the entries the node wrote to topics and streams,
	// dead letters aside: several for a message that a Go function fans out, an aggregate's
	// results, a sink's deliveries (one per message delivered), a source's messages.
	Written int64
	// FailedAttempts counts the attempts that failed, Retries the attempts made again after a
	// failure, as they are made (a batch processed again makes its attempts again).
	FailedAttempts, Retries int64
	// Late and Duplicates count what a stateful stage found late (an aggregate's event for closed
	// windows) or repeated (a dedupe's duplicate), whatever became of it: routed to a topic
	// (out), dead-lettered or dropped.
	Late, Duplicates int64
	// HeldBack is how long the node's writers waited for topics at their max_lag, in all;
	// HeldBackBy names the topic one of them waits for now ("" when none waits).
	HeldBack   time.Duration
	HeldBackBy string
	// Delayed is how long the node's messages waited because its kind delayed them (a rate_limit
	// stage's messages over their limit), in all; Delaying counts those that wait now.
	Delayed  time.Duration
	Delaying int
	// PausedSince is when the node's attempts began to fail transiently (its downstream went
	// away), while they do; PausedBy is the last such failure. Zero and "" otherwise.
	PausedSince time.Time
	PausedBy    string
	// CatchingUp names the table a lookup stage waits for, before it looks anything up, while it
	// waits: until the table has committed what its topic held when the stage started. "" otherwise.
	CatchingUp string
	// Reasons are the first few distinct reasons why messages were dead-lettered, in the order they
	// first happened, with how many had each; DeadLettered counts those with other reasons too.
	// They are tallied as the dead letters are made and logged, so a batch processed again tallies
	// its reasons again.
	Reasons []DeadLetterReason
	// LastDeadLetters are the latest five dead letters the node made in this process, newest
	// first, with their reasons: the live page shows them. Like Reasons, they are recorded as the
	// dead letters are made.
	LastDeadLetters []RecentDeadLetter
}

// DeadLettered is the number of messages the run sent to dead-letter streams.
func (s *Summary) DeadLettered() int64 {
	var n int64
	for _, ns := range s.Nodes {
		n += ns.DeadLettered
	}
	return n
}

// nodeSummaries reads every node's counters, and the reasons of its dead letters.
func nodeSummaries(nodes []*node, deadLetters *deadLetterLog) []NodeSummary {
	out := make([]NodeSummary, 0, len(nodes))
	for _, n := range nodes {
		c := n.stats.counts()
		ns := NodeSummary{
			Name: n.name, Type: n.typ, Kind: n.kind,
			In: c.in, Out: c.out, Filtered: c.filtered, Dropped: c.dropped, Absorbed: c.absorbed,
			DeadLettered: c.deadLettered, InFlight: c.inFlight(),
			Written: c.written, FailedAttempts: n.stats.failedAttempts.Load(), Retries: n.stats.retries.Load(),
			Late: c.late, Duplicates: c.duplicates,
			HeldBack: time.Duration(n.stats.heldBack.Load()), Reasons: deadLetters.reasons(n.name),
			LastDeadLetters: deadLetters.latest(n.name),
			CatchingUp:      n.catchingUp(),
			Delayed:         time.Duration(n.stats.delayed.Load()), Delaying: int(n.stats.delaying.Load()),
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
