package flow

import (
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// A test file (NAME.flowtest.hcl, or NAME.flowtest.hcl.json in JSON syntax) holds tests of the
// pipeline beside it or above its tests/ directory; `flowrun test` runs them (package flowtest) and
// `flowrun validate` checks them. The pipeline loader skips test files. This file is the test
// language's model: what LoadTestFile decodes and TestFile.Check resolves against a Plan. The
// decoding is testfile_decode.go, the checks against the pipeline testfile_check.go.
const (
	TestFileExt     = ".flowtest.hcl"
	TestFileJSONExt = ".flowtest.hcl.json"
	// TestDir is the directory under a pipeline's directory where its test files may also live.
	TestDir = "tests"
)

// Match modes of an expect block.
const (
	MatchExact     = "exact"     // the same messages, in the same order for each key (the default)
	MatchUnordered = "unordered" // the same messages, in any order
	MatchSubset    = "subset"    // at least these messages, in any order, among others
)

// Metric counters that an assert may read as metrics.<node>.<counter>: the outcomes of the
// messages a node took in, which add up (in = out + filtered + dropped + absorbed + dead_lettered +
// in_flight), then what is not an outcome of a message.
var TestCounters = []string{"in", "out", "filtered", "dropped", "absorbed", "dead_lettered", "in_flight",
	"written", "failed_attempts", "retries", "late", "duplicates"}

// TestCounterAliases are older names of counters, which test files may still use.
var TestCounterAliases = map[string]string{"retried": "retries"}

// TestFile is one test file, decoded (LoadTestFile) and, once Check has run, resolved against the
// pipeline: every reference in it names a node or topic of the plan.
type TestFile struct {
	Path string // as found, relative to the working directory when the pipeline path was
	// Variables set the pipeline's variables for every run of the file (compile the plan with
	// Options.Values); nil when the file has no variables block.
	Variables map[string]cty.Value
	// VariableRanges are where each variable is set, for Options.ValueRanges.
	VariableRanges map[string]hcl.Range
	Mocks          []*TestMock
	Overrides      []*TestSinkOverride
	Runs           []*TestRun
	// Plan is the plan that Check resolved the file against: the pipeline compiled with Variables.
	Plan *Plan

	files map[string]*hcl.File // for diagnostics with snippets; see Files
}

// Files returns the parsed files (the test file, golden and fixture files are not included) for
// printing diagnostics with source snippets.
func (f *TestFile) Files() map[string]*hcl.File { return f.files }

// TestMock replaces the Go stage function Func in every go stage that calls it. Each call takes the
// next result; calls after the last result get the last one again.
type TestMock struct {
	Func    string
	Results []*TestMockResult
	Range   hcl.Range // the block's header
}

// TestMockResult is what one call of a mocked function does (or Times calls in a row): fail with
// Error, drop the message, return Outputs computed from the input, or (none of these) return the
// input unchanged.
type TestMockResult struct {
	Error     string // non-empty: the call fails with this error
	Permanent bool   // the error is permanent: dead-lettered without a retry
	Drop      bool   // the call returns no message
	// Outputs are per-message expressions over msg (the input's payload), one output message each.
	Outputs []*MessageExpr
	Times   int // how many consecutive calls get this result; at least 1
	Range   hcl.Range
}

// TestSinkOverride makes an http sink's requests get Responses (HTTP status codes) in order, one per
// attempt, without sending anything; the last repeats. Other sinks need no override: in a test every
// sink captures what it receives and writes nothing outside.
type TestSinkOverride struct {
	Sink      string
	Responses []int
	Range     hcl.Range
}

// TestRun is a run block: its Steps in order, then its expectations. Runs execute in file order and
// share Redis, the clock and the running pipeline with the runs before them unless Reset is set.
type TestRun struct {
	Name  string
	Reset bool // start on an empty Redis, a new clock and a fresh pipeline
	// Steps always has at least one element: the run's own send blocks and advance are Steps[0]
	// (with no expectations of its own), its step blocks follow.
	Steps []*TestStep
	// Expect, ExpectDeadLetters and Asserts are checked after the last step, over what arrived
	// during the whole run.
	Expect            []*TestExpect
	ExpectDeadLetters []*TestExpectDeadLetters
	Asserts           []*TestAssert
	Range             hcl.Range // the block's header
}

// TestStep is one phase of a run: crash the pipeline if asked, send, run (for Advance on the virtual
// clock, or until drained when Advance is 0), then check the step's own expectations, over what
// arrived during the run so far.
type TestStep struct {
	// Crash kills the running pipeline as SIGKILL would (no lease released, nothing acknowledged)
	// and starts a new one, which takes over once the dead one's leases expire on the virtual clock.
	Crash             bool
	Sends             []*TestSend
	Advance           time.Duration // 0: until the pipeline is drained
	Expect            []*TestExpect
	ExpectDeadLetters []*TestExpectDeadLetters
	Asserts           []*TestAssert
	Range             hcl.Range // the step block's header; the run's for Steps[0]
}

// TestSend puts messages into a topic or a source's output (a source produces nothing else in a
// test). Exactly one of Topic and Source is set once checked.
type TestSend struct {
	Topic    string // a topic of the plan (declared, or a stage's implicit output)
	Source   string // a source of the plan: the messages enter as the source's own
	Messages []TestMessage
	File     string // the JSON-lines file the messages came from, resolved against the test file's directory; "" when inline
	Range    hcl.Range

	ref testRef // topic.NAME, stage.NAME or source.NAME as written, for Check
}

// TestMessage is a message that a test sends or expects.
type TestMessage struct {
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

// TestExpect compares what arrived at a sink or topic with Messages, or counts it.
type TestExpect struct {
	Sink  string // exactly one of Sink and Topic is set once checked
	Topic string
	// Messages are the expected messages, inline or from File (a golden file, which
	// `flowrun test -update` rewrites with what arrived).
	Messages    []TestMessage
	HasMessages bool
	File        string // resolved against the test file's directory; "" when inline
	Match       string // MatchExact (default), MatchUnordered or MatchSubset
	Count       int    // HasCount: exactly this many messages arrived
	HasCount    bool
	Range       hcl.Range

	ref testRef // sink.NAME, topic.NAME or stage.NAME as written, for Check
}

// TestExpectDeadLetters checks the dead letters of a node during the run.
type TestExpectDeadLetters struct {
	NodeType string // "source", "stage" or "sink"
	Node     string
	Count    int
	HasCount bool
	Messages []TestDeadLetter // each must match a distinct dead letter of the node
	Range    hcl.Range

	ref testRef
}

// TestDeadLetter is an expected dead letter; its zero fields match anything.
type TestDeadLetter struct {
	Payload  []byte // compact JSON; nil: any payload
	Reason   string // a substring of the dead letter's reason
	Attempts int    // 0: any number of attempts
	Range    hcl.Range
}

// TestAssert is a condition over what the run saw:
//
//	output.<sink or topic>        list of the payloads that arrived (JSON values)
//	dead_letters.<node>           list of { payload, reason, attempts, key }
//	metrics.<node>.<counter>      number; the counters are TestCounters
type TestAssert struct {
	Condition    hcl.Expression
	ErrorMessage string
	Range        hcl.Range
}
