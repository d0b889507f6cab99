package flowtest

import (
	"time"

	"github.com/hashicorp/hcl/v2"
)

// Arrived is a message as a test saw it: sent, or arrived at a sink or a topic.
type Arrived struct {
	Key     string
	Payload []byte // the JSON payload as it arrived
	// Where is the node or topic it arrived at or was sent to: "sink.NAME", "topic.NAME" or
	// "source.NAME" (sent to a source).
	Where string
}

// DeadLetter is a dead letter as a test saw it.
type DeadLetter struct {
	Node     string // "stage.NAME", "sink.NAME" or "source.NAME"
	Key      string
	Payload  []byte // the message's payload as it was dead-lettered
	Reason   string
	Attempts int
}

// Facts are what happened during a run, for the "why" of a failed expectation.
type Facts struct {
	Sent        []Arrived            // every message the run sent, in order
	Arrivals    map[string][]Arrived // what arrived, by Arrived.Where (every sink and topic)
	DeadLetters []DeadLetter         // every dead letter of the run
	Nodes       []NodeFacts          // every node of the plan, in plan order
	// Dropped are the messages that stateful stages passed on nowhere (late or repeated), in the
	// order they were dropped.
	Dropped []Dropped
	// Waiting is what the stateful stages with timers hold at the end: per partition with a timer
	// set, the watermark and the next timer, which fires when the watermark reaches it (a window's
	// end plus grace, say).
	Waiting []Waiting
}

// Dropped is a message that a stateful stage passed on nowhere.
type Dropped struct {
	Node    string // "stage.NAME"
	Key     string
	Payload []byte
	Why     string // "late" or "repeated"
}

// Waiting is what a stateful stage's partition holds for later: its timers, and the watermark
// that they wait for.
type Waiting struct {
	Node      string // "stage.NAME"
	Partition int
	Watermark time.Time // zero: none yet
	Timers    int64
	NextTimer time.Time
}

// NodeFacts are one node's counters during the run.
type NodeFacts struct {
	Name string // "stage.NAME" and so on
	Kind string // "filter", "map", ...
	// The outcomes of the messages the node took in (In = Out + Filtered + Dropped + Absorbed +
	// DeadLettered + InFlight), and its retries.
	In, Out, Filtered, Dropped, Absorbed, DeadLettered, InFlight, Retries int64
	// Late counts the messages a stateful stage found late, whatever became of them.
	Late int64
	// Condition is where the node's condition is written ("file:line"): a sink's where, or the
	// block of a stage whose kind is conditional (stages.StageTraits.Conditional: a filter, a
	// route); "" for others.
	Condition string
}

// Failure is one expectation or assert that did not hold.
type Failure struct {
	Range   hcl.Range // the expect, expect_dead_letters or assert block (or the message) that failed
	Summary string    // one line
	Diff    string    // expected against actual, when messages were compared; may span lines
	Why     []string  // what happened to the inputs, one line each
}

// RunResult is the outcome of one run block.
type RunResult struct {
	File     string // the test file's path
	Run      string // the run's name
	Failures []Failure
	// Err is set when the run could not be carried out (the pipeline stopped with an error, or did
	// not drain and had nothing scheduled); the run failed.
	Err     error
	Wall    time.Duration // real time the run took
	Virtual time.Duration // time that passed on the virtual clock
	Seed    int64
	// Seen is every message that arrived at each sink and topic during the run, by Arrived.Where,
	// and DeadLetters every dead letter of the run, for -v.
	Seen        map[string][]Arrived
	DeadLetters []DeadLetter
	// Updated lists the golden files that -update rewrote because what arrived differs from them.
	Updated []string
}

// Passed reports whether the run passed.
func (r *RunResult) Passed() bool { return r.Err == nil && len(r.Failures) == 0 }
