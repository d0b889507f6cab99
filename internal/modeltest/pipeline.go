package modeltest

import "time"

// Message is a message's payload, as JSON decodes it: numbers are float64.
type Message map[string]any

// Expr is a drawn per-message expression: its text in the pipeline and what it means.
type Expr struct {
	HCL  string
	Eval func(Message) any
}

// Pipeline is a drawn pipeline. Its blocks are in the order they were drawn, which is an order in
// which every block's input comes before it.
type Pipeline struct {
	Delivery string // "at_least_once" or "effectively_once"
	Topics   []*Topic
	Sources  []*Source
	Stages   []*Stage
	Sinks    []*Sink
}

// Topic is a declared topic.
type Topic struct {
	Name       string
	Partitions int
	Key        *Expr // nil: a message keeps the key it arrives with
}

// Source is a file source: it writes one of the draw's inputs, line by line, to its topic.
type Source struct {
	Name   string
	Output *Topic
	Input  int // the index of its input in Draw.Inputs
}

// Ref is what a stage or sink reads: a declared topic, or a stage's own output (stage.NAME).
type Ref struct {
	Topic *Topic
	Stage *Stage
}

// HCL is the reference as a pipeline writes it.
func (r Ref) HCL() string {
	if r.Stage != nil {
		return "stage." + r.Stage.Name
	}
	return "topic." + r.Topic.Name
}

// Stage is a drawn stage of one of the kinds the model knows.
type Stage struct {
	Name   string
	Kind   string // "filter", "map", "route", "dedupe", "aggregate", "pattern" or "join"
	Input  Ref    // a join's left side
	Output *Topic // nil: its own output, which others read as stage.NAME

	Where *Expr // filter

	Set  []Field // map
	Drop []string

	Cases   []Case // route
	Default *Topic

	Key        *Expr // dedupe
	Within     time.Duration
	Duplicates *Topic // nil: dropped

	// EventTime is a dedupe's or aggregate's event time, in Unix milliseconds; nil on an aggregate
	// of results: the event time the result carries (its window's start).
	EventTime  *Expr
	GroupBy    *Expr // aggregate
	Window     Window
	Grace      time.Duration
	Late       string // "dead_letter", "drop", or "" with LateTopic
	LateTopic  *Topic
	Aggregates []Aggregate

	Steps  []Step  // pattern, with Key, EventTime, Within and Grace
	Select []Field // pattern and join: its results' fields, over the steps' or sides' messages by name

	// A join's right side and its span, with Key and EventTime for its left side, Grace and Select.
	Right          Ref
	RightKey       *Expr
	RightEventTime *Expr
	JoinType       string // "inner", "left" or "outer"
	Before, After  time.Duration
}

// Step is one step of a pattern's sequence.
type Step struct {
	Name  string
	Where *Expr
}

// Field is one field a map sets.
type Field struct {
	Name string
	Expr *Expr
}

// Case is a route's branch.
type Case struct {
	When   *Expr
	Output *Topic
}

// Window is an aggregate's window.
type Window struct {
	Type    string // "tumbling", "hopping" or "session"
	Size    time.Duration
	Advance time.Duration // hopping
	Gap     time.Duration // session
}

// Aggregate is one field of an aggregate's results: Func over Arg (nil for count).
type Aggregate struct {
	Name string
	Func string // count, sum, min, max, avg, count_distinct, first, last, top_k, max_by or min_by
	Arg  *Expr
	K    int   // top_k
	By   *Expr // max_by and min_by
}

// Sink writes what it reads to a Redis stream of the test's, named by Draw.SinkStream.
type Sink struct {
	Name  string
	Input Ref
}
