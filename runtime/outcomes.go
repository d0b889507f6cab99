package runtime

import (
	"sync"
	"sync/atomic"
)

// What a node did, counted so that it adds up. Every message a node takes in ends in exactly one
// outcome:
//
//	out           passed on: it produced at least one output (a sink: it was delivered; a
//	              source: it was written to the output topic)
//	filtered      it produced nothing, by design (a filter, a route's unmatched message without a
//	              default, a sink's where)
//	dropped       a stateful stage found it late or a duplicate and passed it on nowhere
//	              (late = "drop", duplicates = "drop")
//	absorbed      a windowed stage (an aggregate, a stateful Go function that fires at the end)
//	              took it into its state: the results come later, from its timers
//	dead-lettered it failed for good, or could not be decoded (a source: it was rejected)
//
// so that, per node, in = out + filtered + dropped + absorbed + dead-lettered + in flight, where in
// flight are the messages the node took in that wait in its retry set for a later attempt (0 once a
// job is done). A message counts, in and outcome, once: when the batch that settles it commits.
// Nothing is counted while a batch is processed, so a batch processed again (its commit failed, its
// lease was lost, the process died) counts its messages once, when it is committed. A message that
// waits in the retry set counts in when the batch that parked it commits, and its outcome when the
// batch of its last attempt does; a dead letter replayed to the node (its attempts start again)
// is a message taken in again.
//
// What is not an outcome of one message is counted apart, under names that say what they count:
// entries written (a Go function that fans out writes several for one message, an aggregate's
// results come from its timers, a sink delivers one per message, a source's messages are entries
// of its topic; dead letters are not among them), failed attempts and retries (counted as they are
// made: a batch processed again makes its attempts again), and what stateful stages found late or
// repeated, whatever became of it (late, duplicates, counted with the batch).
//
// A commit whose reply is lost (the connection dropped) may have been applied or not: its counts
// wait until the worker has read its pending entries again. If none of the batch's entries comes
// back, the commit was applied and they count; otherwise the batch is processed again and counts
// then. The counters are this process's: a message parked by one process and settled by another
// counts in in the first and its outcome in the second, so in flight adds up over all processes.

// outcome is what the handler said became of a message that produced no outputs to write: the
// rest (outputs, a dead letter, a retry) the message's result says.
type outcome uint8

const (
	outcomeFiltered  outcome = iota // nothing passed on, by design (the default)
	outcomeDelivered                // a sink delivered it to the outside world
	outcomeDropped                  // a stateful stage dropped it, late or repeated
	outcomeAbsorbed                 // a windowed stage took it into its windows
	outcomeHandedOn                 // a retry for a stage that does not run here, handed to its input (handOn)
)

// counts are what a node did in one batch, or since the run started.
type counts struct {
	// in and the outcomes of its messages.
	in, out, filtered, dropped, absorbed, deadLettered int64
	// written counts the entries it wrote to topics (a sink: its deliveries); late and duplicates
	// what a stateful stage found late or repeated. None of them is an outcome.
	written, late, duplicates int64
}

func (c *counts) add(o *counts) {
	c.in += o.in
	c.out += o.out
	c.filtered += o.filtered
	c.dropped += o.dropped
	c.absorbed += o.absorbed
	c.deadLettered += o.deadLettered
	c.written += o.written
	c.late += o.late
	c.duplicates += o.duplicates
}

// inFlight is what the node took in and has not settled: messages that wait in its retry set.
func (c *counts) inFlight() int64 {
	return c.in - c.out - c.filtered - c.dropped - c.absorbed - c.deadLettered
}

// settle counts what became of message m at a node, by its result; fresh says that the message is
// new to the node (not a retry that the node parked itself). An abandoned message is not counted:
// it comes again.
func (c *counts) settle(m *message, res *result, fresh bool) {
	if fresh {
		c.in++
	}
	switch {
	case len(res.retries) > 0:
		// It waits in the retry set: in flight until the batch of its last attempt settles it.
	case len(res.deadLetters) > 0:
		c.deadLettered++
	case len(res.outs) > 0:
		c.out++
		c.written += int64(len(res.outs))
	case m.outcome == outcomeDelivered:
		c.out++
		c.written++
	case m.outcome == outcomeDropped:
		c.dropped++
	case m.outcome == outcomeAbsorbed:
		c.absorbed++
	default:
		c.filtered++
	}
}

// fresh reports whether a message is new to the node that processes it: an entry read from the
// stream, a dead letter replayed (its attempts start again), or a retry handed on from a stage
// that no longer runs where it was parked; not a retry that the node parked itself, which it
// counted in when it parked it.
func (m *message) fresh() bool {
	return m.retry == nil || m.retry.Attempts == 0 || m.outcome == outcomeHandedOn
}

// nodeStats counts what a node did, for the summary, the snapshots and the metrics.
type nodeStats struct {
	mu      sync.Mutex // a batch's counts are added, and read, together: they add up at every reading
	counted counts

	failedAttempts atomic.Int64 // attempts that failed
	retries        atomic.Int64 // attempts made again after a failure

	delayed  atomic.Int64 // nanoseconds its messages waited because its kind delayed them (a rate limit)
	delaying atomic.Int32 // its messages waiting so now

	heldBack atomic.Int64           // nanoseconds its writers waited at capped topics (backpressure)
	holding  atomic.Int32           // its writers waiting now
	heldBy   atomic.Pointer[string] // the topic the latest of them waits for
}

// count adds a committed batch's counts.
func (s *nodeStats) count(c *counts) {
	s.mu.Lock()
	s.counted.add(c)
	s.mu.Unlock()
}

// counts returns the node's counts so far.
func (s *nodeStats) counts() counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counted
}

// batchCounts are a batch's counts, one per node of its unit: the node, or each stage of its fused
// chain (whose lanes count at once).
type batchCounts struct {
	mu    sync.Mutex
	nodes []counts
}

func newBatchCounts(n *node) *batchCounts {
	if n.chain != nil {
		return &batchCounts{nodes: make([]counts, len(n.chain.nodes))}
	}
	return &batchCounts{nodes: make([]counts, 1)}
}

// addChain adds what one message did at each stage of a chain.
func (b *batchCounts) addChain(per []counts) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range per {
		b.nodes[i].add(&per[i])
	}
}
