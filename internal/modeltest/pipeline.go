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
	// OffloadOver is the pipeline's offload_over, "" for the default (64KiB, which no drawn message
	// reaches). A small one offloads nearly every payload, everywhere: topics, dead letters, the
	// links of unfused chains (but on the embedded Redis, which offloads nothing).
	OffloadOver string
	Topics      []*Topic
	Tables      []*Table
	Sources     []*Source
	Stages      []*Stage
	Sinks       []*Sink
}

// Topic is a declared topic.
type Topic struct {
	Name       string
	Partitions int
	Key        *Expr // nil: a message keeps the key it arrives with
}

// Table is a table block over a topic that no source or stage of the pipeline writes: the test
// writes its updates there before the pipeline starts. A lookup takes the ends of the table's
// topic when it starts and waits until the table has caught up with them, so every lookup of the
// run sees the table as the whole of Updates makes it, whatever the processes, kills and timing:
// what the model can predict exactly. (Updates that arrive while lookups run apply at processing
// time, which no model of the input alone can say; runtime/tables_test.go proves those by
// construction.)
type Table struct {
	Name  string
	Input *Topic
	Key   *Expr // nil: each row's key is its message's key
	// Updates are what the test writes to Input, in this order. A key's last update is its row;
	// one with a nil Row deletes the key (a null payload with the key). A key's updates all go to
	// one partition of Input, which keeps their order.
	Updates []Update
	// Versioned: the table keeps every version (history) with its event time, the row's "upd"
	// (Unix ms, increasing through a key's updates), for lookups as_of; it has no deletes, whose
	// time would be the table's watermark when read, which no model can say.
	Versioned bool
}

// Update is one message of a table's topic.
type Update struct {
	Key string
	Row Message // nil: delete the key
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
	Kind   string // "filter", "map", "route", "dedupe", "aggregate", "pattern", "join" or "lookup"
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

	Table   *Table // lookup, with Key: the table it reads
	As      string // lookup: the field the row lands at
	Missing string // lookup: "null", "drop" or "dead_letter"
	AsOf    *Expr  // lookup of a Versioned table: the row as of this event time; nil: the latest

	// rate_limit, with Key (nil: one limit for every message): Rate messages per second, Burst at once.
	Rate, Burst int
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
