package testfile

import (
	"slices"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/flowrun/flowrun/flow"
)

// This file is the test language's model: what Load decodes and File.Check resolves against a
// flow.Plan. The decoding is decode.go (with attributes.go and messages.go), the checks against
// the pipeline check.go.

// Match modes of an expect block.
const (
	MatchExact     = "exact"     // the same messages, in the same order for each key (the default)
	MatchUnordered = "unordered" // the same messages, in any order
	MatchSubset    = "subset"    // at least these messages, in any order, among others
)

// Counters are the metric counters that an assert may read as metrics.<node>.<counter>: the outcomes of the
// messages a node took in, which add up (in = out + filtered + dropped + absorbed + dead_lettered +
// in_flight), then what is not an outcome of a message.
var Counters = []string{"in", "out", "filtered", "dropped", "absorbed", "dead_lettered", "in_flight",
	"written", "failed_attempts", "retries", "late", "duplicates"}

// CounterAliases are older names of counters, which test files may still use.
var CounterAliases = map[string]string{"retried": "retries"}

// File is one test file, decoded (Load) and, once Check has run, resolved against the
// pipeline: every reference in it names a node or topic of the plan.
type File struct {
	Path string // as found, relative to the working directory when the pipeline path was
	// Variables set the pipeline's variables for every run of the file (compile the plan with
	// flow.Options.Values); nil when the file has no variables block.
	Variables map[string]cty.Value
	// VariableRanges are where each variable is set, for flow.Options.ValueRanges.
	VariableRanges map[string]hcl.Range
	Mocks          []*Mock
	Overrides      []*SinkOverride
	Runs           []*Run
	// Plan is the plan that Check resolved the file against: the pipeline compiled with Variables.
	Plan *flow.Plan

	files map[string]*hcl.File // for diagnostics with snippets; see Files
}

// Files returns the parsed files (the test file, golden and fixture files are not included) for
// printing diagnostics with source snippets.
func (f *File) Files() map[string]*hcl.File { return f.files }

// AllMocks returns the file's mocks and its runs' mocks: every function a run may call mocked.
func (f *File) AllMocks() []*Mock {
	all := slices.Clone(f.Mocks)
	for _, r := range f.Runs {
		all = append(all, r.Mocks...)
	}
	return all
}

// Mock replaces the Go stage function Func in every go stage that calls it. Each call takes the
// next result; calls after the last result get the last one again.
type Mock struct {
	Func    string
	Results []*MockResult
	Range   hcl.Range // the block's header
}

// MockResult is what one call of a mocked function does (or Times calls in a row): fail with
// Error, drop the message, return Outputs computed from the input, or (none of these) return the
// input unchanged.
type MockResult struct {
	Error     string // non-empty: the call fails with this error
	Permanent bool   // the error is permanent: dead-lettered without a retry
	Drop      bool   // the call returns no message
	// Outputs are per-message expressions over msg (the input's payload), one output message each.
	Outputs []*flow.MessageExpr
	Times   int // how many consecutive calls get this result; at least 1
	Range   hcl.Range
}

// SinkOverride makes an http sink's requests get Responses (HTTP status codes) in order, one per
// attempt, without sending anything; the last repeats. Other sinks need no override: in a test every
// sink captures what it receives and writes nothing outside.
type SinkOverride struct {
	Sink      string
	Responses []int
	Range     hcl.Range
}

// Run is a run block: its Steps in order, then its expectations. Runs execute in file order and
// share Redis, the clock and the running pipeline with the runs before them unless Reset is set.
type Run struct {
	Name  string
	Reset bool // start on an empty Redis, a new clock and a fresh pipeline
	// Steps always has at least one element: the run's own send blocks and advance are Steps[0]
	// (with no expectations of its own), its step blocks follow.
	Steps []*Step
	// Expect, ExpectDeadLetters and Asserts are checked after the last step, over what arrived
	// during the whole run.
	Expect            []*Expect
	ExpectDeadLetters []*ExpectDeadLetters
	Asserts           []*Assert
	// Mocks and Overrides apply to this run only, in place of the file's for the same function or
	// sink (as Terraform's overrides in a run block): each starts at its first result or response
	// when the run starts.
	Mocks     []*Mock
	Overrides []*SinkOverride
	Range     hcl.Range // the block's header
}

// Step is one phase of a run: crash the pipeline if asked, send, run (for Advance on the virtual
// clock, or until drained when Advance is 0), then check the step's own expectations, over what
// arrived during the run so far.
type Step struct {
	// Crash kills the running pipeline as SIGKILL would (no lease released, nothing acknowledged)
	// and starts a new one, which takes over once the dead one's leases expire on the virtual clock.
	Crash             bool
	Sends             []*Send
	Advance           time.Duration // 0: until the pipeline is drained
	Expect            []*Expect
	ExpectDeadLetters []*ExpectDeadLetters
	Asserts           []*Assert
	Range             hcl.Range // the step block's header; the run's for Steps[0]
}

// Send puts messages into a topic or a source's output (a source produces nothing else in a
// test). Exactly one of Topic and Source is set once checked.
type Send struct {
	Topic    string // a topic of the plan (declared, or a stage's implicit output)
	Source   string // a source of the plan: the messages enter as the source's own
	Messages []Message
	File     string // the JSON-lines file the messages came from, resolved against the test file's directory; "" when inline
	Range    hcl.Range

	ref blockRef // topic.NAME, stage.NAME or source.NAME as written, for Check
}

// Message is a message that a test sends or expects.
type Message struct {
	// Payload is the message's JSON payload, as compact JSON.
	Payload []byte
	// Key is the message's key; HasKey is false when the test did not give one (a sent message
	// then gets its topic's key expression's value or none; an expected one matches any key).
	Key    string
	HasKey bool
	// At delays a sent message from the start of its step ("+5s"); always 0 for expected ones.
	At    time.Duration
	Range hcl.Range // where the message is written (its line in a JSON-lines file)
}

// Expect compares what arrived at a sink or topic with Messages, or counts it.
type Expect struct {
	Sink  string // exactly one of Sink and Topic is set once checked
	Topic string
	// Messages are the expected messages, inline or from File (a golden file, which
	// `flowrun test -update` rewrites with what arrived).
	Messages    []Message
	HasMessages bool
	File        string // resolved against the test file's directory; "" when inline
	Match       string // MatchExact (default), MatchUnordered or MatchSubset
	Count       int    // HasCount: exactly this many messages arrived
	HasCount    bool
	Range       hcl.Range

	ref blockRef // sink.NAME, topic.NAME or stage.NAME as written, for Check
}

// ExpectDeadLetters checks the dead letters of a node during the run.
type ExpectDeadLetters struct {
	NodeType string // "source", "stage" or "sink"
	Node     string
	Count    int
	HasCount bool
	Messages []DeadLetter // each must match a distinct dead letter of the node
	Range    hcl.Range

	ref blockRef
}

// DeadLetter is an expected dead letter; its zero fields match anything.
type DeadLetter struct {
	Payload  []byte // compact JSON; nil: any payload
	Reason   string // a substring of the dead letter's reason
	Attempts int    // 0: any number of attempts
	Range    hcl.Range
}

// Assert is a condition over what the run saw:
//
//	output.<sink or topic>        list of the payloads that arrived (JSON values)
//	dead_letters.<node>           list of { payload, reason, attempts, key }
//	metrics.<node>.<counter>      number; the counters are Counters
type Assert struct {
	Condition    hcl.Expression
	ErrorMessage string
	Range        hcl.Range
}
