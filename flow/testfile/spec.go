package testfile

import "github.com/flowrun/flowrun/flow"

// The test language is declared like the pipeline language, as BlockSpecs: the decoder takes its hcl
// schemas from them (so an unknown argument or block is an error with hcl's own "did you mean"),
// and the JSON Schema of .flowtest.hcl.json files and docs/testing-reference.md are generated from
// them. What the specs cannot say (one of topic and source, at only in send, ...) is checked in
// decode.go.

// Language is every top-level block type of a test file, in the order the reference presents them.
var Language = []*flow.BlockSpec{variablesSpec, mockSpec, overrideSinkSpec, runSpec}

var variablesSpec = &flow.BlockSpec{
	Type:     "variables",
	FreeForm: true,
	Doc: "Sets the pipeline's variables for every run of the file, as NAME = VALUE; they win over " +
		"--var, --var-file and the environment. Each must be declared by the pipeline.",
}

var mockResultSpec = &flow.BlockSpec{
	Type: "result",
	Doc: "What one call (or times calls in a row) of the mocked function does: fail with error, drop " +
		"the message, return output or outputs, or, with none of these, return its input unchanged.",
	Attributes: []flow.Attribute{
		{Name: "error", Type: flow.TypeString, Doc: "The call fails with this error; it is retried unless permanent is set."},
		{Name: "permanent", Type: flow.TypeBool, Default: false, Doc: "With error: the message is dead-lettered without a retry."},
		{Name: "drop", Type: flow.TypeBool, Default: false, Doc: "The call returns no message."},
		{Name: "output", Type: flow.TypeMessageObject, Roots: []string{"msg"}, Doc: "The one message the call returns, computed from the input's payload msg."},
		{Name: "outputs", Type: flow.TypeMessageExprList, Roots: []string{"msg"}, Doc: "The messages the call returns, each computed from the input's payload msg."},
		{Name: "times", Type: flow.TypeInteger, Default: int64(1), Min: flow.Bound(1), Doc: "How many consecutive calls get this result."},
	},
}

var mockSpec = &flow.BlockSpec{
	Type:     "mock",
	Labels:   []string{"func"},
	AnyLabel: true,
	Doc: "Replaces a Go stage function (the func of go stages, such as \"acme.score\") in every stage " +
		"that calls it. Each call takes the next result; the calls after the last result get the last one again.",
	Blocks: []flow.NestedBlock{{Spec: mockResultSpec, Min: 1}},
}

var overrideSinkSpec = &flow.BlockSpec{
	Type:   "override_sink",
	Labels: []string{"sink"},
	Doc: "Answers an http sink's requests without sending them. In a test every sink captures what it " +
		"receives and writes nothing outside; an http sink also needs answers to decide on retries.",
	Attributes: []flow.Attribute{
		{
			Name: "responses", Type: flow.TypeIntegerList, Required: true,
			Doc: "The HTTP status codes of the attempts, in order; the last repeats.",
		},
	},
}

var sendSpec = &flow.BlockSpec{
	Type: "send",
	Doc: "Puts messages into a topic, or into a source's output as the source's own (a source " +
		"produces nothing else in a test). Exactly one of topic and source, and one of messages and file.",
	Attributes: []flow.Attribute{
		{Name: "topic", Type: flow.TypeReference, Refs: []string{"topic", "stage"}, Doc: "The topic, as topic.NAME (or stage.NAME for a stage's implicit output)."},
		{Name: "source", Type: flow.TypeReference, Refs: []string{"source"}, Doc: "The source, as source.NAME."},
		{Name: "messages", Type: flow.TypeMessages, Doc: messagesDoc + ` A wrapped message may also have at, a delay from the start of the step such as "+5s".`},
		{Name: "file", Type: flow.TypeString, Doc: "A JSON-lines file of messages, relative to the test file: each line a payload or the wrapped form."},
	},
}

const messagesDoc = "A list of messages: each an object that is the payload, or the wrapped form " +
	"{ payload = {...}, key = \"...\" } (an object with payload and nothing but key, payload and at)."

var expectSpec = &flow.BlockSpec{
	Type: "expect",
	Doc: "Checks what arrived at a sink or topic during the run so far: its messages, their count, or both. " +
		"Exactly one of sink and topic.",
	Attributes: []flow.Attribute{
		{Name: "sink", Type: flow.TypeReference, Refs: []string{"sink"}, Doc: "The sink, as sink.NAME."},
		{Name: "topic", Type: flow.TypeReference, Refs: []string{"topic", "stage"}, Doc: "The topic, as topic.NAME, or stage.NAME for a stage's implicit output."},
		{Name: "messages", Type: flow.TypeMessages, Doc: messagesDoc + " A message without key matches any key."},
		{Name: "file", Type: flow.TypeString, Doc: "A golden JSON-lines file of the expected messages, relative to the test file; `flowrun test -update` rewrites it."},
		{
			Name: "match", Type: flow.TypeString, Default: MatchExact, Enum: []string{MatchExact, MatchUnordered, MatchSubset},
			Doc: "exact: the same messages, in order for each key; unordered: the same in any order; subset: at least these, among others.",
		},
		{Name: "count", Type: flow.TypeInteger, Min: flow.Bound(0), Doc: "Exactly this many messages arrived."},
	},
}

var expectDeadLettersSpec = &flow.BlockSpec{
	Type: "expect_dead_letters",
	Doc:  "Checks the dead letters of a source, stage or sink during the run so far. Exactly one of source, stage and sink.",
	Attributes: []flow.Attribute{
		{Name: "source", Type: flow.TypeReference, Refs: []string{"source"}, Doc: "The source, as source.NAME."},
		{Name: "stage", Type: flow.TypeReference, Refs: []string{"stage"}, Doc: "The stage, as stage.NAME."},
		{Name: "sink", Type: flow.TypeReference, Refs: []string{"sink"}, Doc: "The sink, as sink.NAME."},
		{Name: "count", Type: flow.TypeInteger, Min: flow.Bound(0), Doc: "Exactly this many dead letters."},
		{
			Name: "messages", Type: flow.TypeMessages,
			Doc: "Expected dead letters, each matching a distinct one: objects of payload (an object), reason " +
				"(a substring of the reason) and attempts, each optional.",
		},
	},
}

var assertSpec = &flow.BlockSpec{
	Type: "assert",
	Doc: "A condition over what the run saw: output.NAME (the payloads that arrived at a sink, or else " +
		"a topic, of that name), dead_letters.NODE (objects of payload, reason, attempts and key) and " +
		"metrics.NODE.COUNTER (the outcomes of the messages a node took in, which add up: in = out + filtered + dropped + " +
		"absorbed + dead_lettered + in_flight; and written, failed_attempts, retries, and for stateful stages late and duplicates).",
	Attributes: []flow.Attribute{
		{Name: "condition", Type: flow.TypeCondition, Required: true, Doc: "Must be true."},
		{Name: "error_message", Type: flow.TypeString, Doc: "What the failure says when the condition is false."},
	},
}

// stepBlocks are the blocks that both a run and a step may hold.
var stepBlocks = []flow.NestedBlock{
	{Spec: sendSpec},
	{Spec: expectSpec},
	{Spec: expectDeadLettersSpec},
	{Spec: assertSpec},
}

var advanceAttribute = flow.Attribute{
	Name: "advance", Type: flow.TypeDuration, DefaultDoc: "until drained",
	Doc: "How long the pipeline runs on the virtual clock after the sends; without it, until the pipeline is drained.",
}

var stepSpec = &flow.BlockSpec{
	Type: "step",
	Doc: "One phase of a run, in order: crash if asked, send, run for advance (or until drained), then check the " +
		"step's expectations. A step holds send, expect, expect_dead_letters and assert blocks as a run does.",
	Attributes: []flow.Attribute{
		{
			Name: "crash", Type: flow.TypeBool, Default: false,
			Doc: "Kills the running pipeline as SIGKILL would and starts a new one, which takes over once the dead one's leases expire.",
		},
		advanceAttribute,
	},
	Blocks: stepBlocks,
}

var runSpec = &flow.BlockSpec{
	Type:     "run",
	Labels:   []string{"name"},
	AnyLabel: true,
	Doc: "A test: its own sends and advance, then its steps in order, then its expectations over the whole run. " +
		"Runs execute in file order and share Redis, the clock and the running pipeline unless reset is set. " +
		"A mock or override_sink inside a run applies to that run only, in place of the file's for the same function or sink.",
	Attributes: []flow.Attribute{
		{Name: "reset", Type: flow.TypeBool, Default: false, Doc: "Start on an empty Redis, a new clock and a fresh pipeline."},
		advanceAttribute,
	},
	Blocks: append(append([]flow.NestedBlock(nil), stepBlocks...), flow.NestedBlock{Spec: stepSpec},
		flow.NestedBlock{Spec: mockSpec}, flow.NestedBlock{Spec: overrideSinkSpec}),
}
