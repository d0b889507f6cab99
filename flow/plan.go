package flow

import (
	"math"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/flowrun/flowrun/flow/expr"
)

// Plan is a compiled pipeline: everything the runtime needs and nothing of the HCL syntax tree.
// Ranges are kept only so that runtime errors can point back at the pipeline source.
type Plan struct {
	Name        string
	Description string
	KeyPrefix   string // every Redis key of the pipeline starts with it
	Delivery    Delivery
	// MaxMessageSize is the largest entry, in bytes, that the pipeline's nodes read and its
	// publishers write (transport/redis EntrySize); larger ones are dead-lettered unread.
	MaxMessageSize int64
	// OffloadOver is the payload size, in bytes, above which the pipeline stores a payload under
	// a key of its own and its entry refers to it (transport/redis WithOffloadOver); 0 turns
	// offloading off.
	OffloadOver int64

	Topics  []*Topic  // sorted by name; includes the implicit outputs of stages read as stage.NAME
	Sources []*Source // in declaration order
	Stages  []*Stage  // in dependency order: a stage comes after every stage that feeds it
	Sinks   []*Sink   // in declaration order
	// Tables are the table blocks, sorted by name; each one's stage is among Stages.
	Tables []*Table
	Edges  []Edge // every connection between a node and a topic, for graphs and lag reports
	// Chains are the groups of stages that run in one hop (fusion.go).
	Chains []*Chain

	Variables []Variable // declared variables with their final values

	// Definitions hash each node's definition as written, by address ("stage.enrich"): a reload
	// restarts the nodes whose hash changed (definitions.go).
	Definitions map[string]string
	// StateShapes say, for each stateful stage by name, what its state means: its kind, key and
	// the attributes of its kind's Kind.StateShape. StateFingerprint hashes it (definitions.go).
	StateShapes map[string]string

	secrets []string // the string forms of the sensitive variables' values, longest first
}

// Topic is a partitioned stream of messages.
type Topic struct {
	Name       string
	Partitions int
	// Key computes a message's key from its payload; nil keeps the key the message arrived with.
	Key       *expr.Program
	Retention Retention
	// MaxLag caps each partition's backlog (entries its slowest reader has not processed); 0: no cap.
	MaxLag int64
	// Schema is the JSON Schema every message written to the topic satisfies; nil: any message.
	Schema *MessageSchema
	// Implicit marks a topic that no block declares: the output of a stage that is read as stage.NAME.
	Implicit bool
	// Stage is the stage whose implicit output this is; empty for declared topics.
	Stage string
	// Repartition is the stage the compiler inserted to write this repartition topic (see
	// RepartitionKind); nil for other topics.
	Repartition *Stage
	// Watermark says how the topic's partitions get their watermarks (watermarks.go); nil when no
	// stateful stage depends on the topic.
	Watermark *TopicWatermark
	Range     hcl.Range
}

// Retention bounds a topic's streams. Zero values mean unbounded.
type Retention struct {
	MaxLen int64
	MaxAge time.Duration
}

// Delivery is a hop's delivery guarantee.
type Delivery string

const (
	AtLeastOnce     Delivery = "at_least_once"
	EffectivelyOnce Delivery = "effectively_once"
)

// Ordering says which messages of a stage's input may be processed concurrently.
type Ordering string

const (
	OrderByKey       Ordering = "key"       // parallel lanes by key inside a partition; order kept per key
	OrderByPartition Ordering = "partition" // strictly serial per partition
	OrderNone        Ordering = "none"      // any consumer, most parallel
)

// Backoff is the shape of the delays between attempts.
type Backoff string

const (
	BackoffConstant    Backoff = "constant"
	BackoffLinear      Backoff = "linear"
	BackoffExponential Backoff = "exponential"
)

// RetryPolicy says how often and how patiently a failed message is retried before it is dead-lettered.
type RetryPolicy struct {
	Name        string // the retry block's name; empty for the default policy
	MaxAttempts int    // attempts in all, the first one included; 0: no limit
	// MaxElapsed bounds the time from a message's first failure to its last attempt; 0: no limit.
	MaxElapsed time.Duration
	Backoff    Backoff
	Initial    time.Duration
	Max        time.Duration
	Jitter     float64 // fraction of the delay randomised, in [0, 1]
}

// GivesUp reports whether a message that has failed attempts times, first at firstFailure, gets no
// further attempt at now.
func (r RetryPolicy) GivesUp(attempts int, firstFailure, now time.Time) bool {
	if r.MaxAttempts > 0 && attempts >= r.MaxAttempts {
		return true
	}
	return r.MaxElapsed > 0 && !firstFailure.IsZero() && now.Sub(firstFailure) >= r.MaxElapsed
}

// Delay is the wait before the given retry (1 for the first retry), without jitter. It saturates at Max
// instead of overflowing, however large the attempt number.
func (r RetryPolicy) Delay(retry int) time.Duration {
	if retry < 1 {
		retry = 1
	}
	var d float64
	switch r.Backoff {
	case BackoffConstant:
		d = float64(r.Initial)
	case BackoffLinear:
		d = float64(r.Initial) * float64(retry)
	default:
		d = float64(r.Initial) * math.Pow(2, float64(retry-1))
	}
	if r.Max > 0 && d > float64(r.Max) {
		return r.Max
	}
	if d >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(d)
}

// Source brings messages into the pipeline.
type Source struct {
	Name   string
	Kind   string
	Spec   *Kind // the kind's declaration; nil when the kind is unknown
	Output *Topic
	Config Attrs // the kind's own attributes
	Range  hcl.Range
}

// Stage reads one topic, processes each message and writes to its outputs.
type Stage struct {
	Name  string
	Kind  string
	Spec  *Kind // the kind's declaration; nil when the kind is unknown
	Input *Topic
	// Output is where results go; nil for a kind with its own outputs (Kind.OwnOutputs), which are in its Config.
	Output *Topic
	Retry  RetryPolicy
	// RetryInPlace makes a failed message wait for its retry in the process, holding back the
	// messages behind it; otherwise longer delays wait in Redis while later messages go on.
	RetryInPlace bool
	DeadLetter   *Topic // nil: the stage's own dead-letter stream
	Ordering     Ordering
	Concurrency  int
	Timeout      time.Duration
	Delivery     Delivery
	Config       Attrs // the kind's own attributes
	Range        hcl.Range
	// Repartitions, for a stage of RepartitionKind, is the stateful stage it repartitions for; its
	// Config is that stage's.
	Repartitions *Stage
	// Side, for a stage of RepartitionKind that writes one side of a stage with two inputs (a join's
	// left or right, Kind.Sides), names the side; its Config is that side's block.
	Side string
	// Fuse lets the stage run in one hop with the stages it is chained with (fusion.go).
	Fuse bool
	// Chain is the chain the stage runs in; nil when it runs in a hop of its own.
	Chain *Chain
	// Watermark is what the stage's units keep of their input partitions' watermarks
	// (watermarks.go); nil when no stateful stage depends on the stage and it keeps no state.
	Watermark *StageWatermark
}

// Outputs lists every topic the stage may write to, in a stable order, dead letters excluded: its
// output, a kind's own outputs (a route's cases) and its side outputs (SideOutputs).
func (s *Stage) Outputs() []*Topic {
	var out []*Topic
	if s.Output != nil {
		out = append(out, s.Output)
	}
	if s.Kind == RepartitionKind {
		return out // its Config is the stateful stage's, whose side outputs are that stage's
	}
	return append(out, s.Config.topics()...)
}

// SideOutputs lists the topics that the stage sends some messages to in place of its output, each
// labelled with the attribute that names it: an aggregate's late = topic.NAME, a dedupe's
// duplicates = topic.NAME. They are the topics its kind's attributes name, but for the kind's own
// outputs (Kind.OwnOutputs, a route's cases). Dead letters are not among them (DeadLetter).
func (s *Stage) SideOutputs() []KindOutput {
	if s.Kind == RepartitionKind {
		return nil
	}
	own := map[*Topic]bool{}
	if s.Spec != nil && s.Spec.OwnOutputs != nil {
		for _, o := range s.Spec.OwnOutputs(s.Config) {
			own[o.Topic] = true
		}
	}
	var out []KindOutput
	for _, o := range s.Config.topicAttrs() {
		if !own[o.Topic] {
			out = append(out, o)
		}
	}
	return out
}

// Sink delivers messages out of the pipeline.
type Sink struct {
	Name         string
	Kind         string
	Spec         *Kind // the kind's declaration; nil when the kind is unknown
	Input        *Topic
	Where        *expr.Program // nil: every message
	Retry        RetryPolicy
	RetryInPlace bool   // see Stage.RetryInPlace
	DeadLetter   *Topic // nil: the sink's own dead-letter stream
	Delivery     Delivery
	Config       Attrs
	Range        hcl.Range
}

// Variable is a declared variable with the value it compiled with. Sensitive values must never be
// printed: the runtime redacts them from logs and errors.
type Variable struct {
	Name        string
	Description string
	Sensitive   bool
	Value       cty.Value
}

// EdgeKind says what an edge carries.
type EdgeKind string

const (
	EdgeReads  EdgeKind = "reads"  // topic -> stage or sink
	EdgeWrites EdgeKind = "writes" // source or stage -> topic: its output, a route's cases
	// EdgeSideOutput is a stage's route for some of its messages in place of its output (Stage.
	// SideOutputs): stage -> topic, labelled with the attribute, "late" or "duplicates".
	EdgeSideOutput EdgeKind = "side_output"
	EdgeDeadLetter EdgeKind = "dead_letter" // stage or sink -> its dead_letter topic
	// EdgeLookup is a table's stage -> a lookup stage that reads the table. It is drawn (Graph),
	// not among Plan.Edges, which connect nodes with topics: no stream carries it.
	EdgeLookup EdgeKind = "lookup"
)

// Edge connects a node ("source.x", "stage.y", "sink.z") with a topic ("topic.t").
type Edge struct {
	From, To string
	Kind     EdgeKind
	Label    string // a route case's condition, "default", a side output's attribute ("late")
}

// Writes reports whether the edge's node writes messages to the topic as its results: its output,
// a route's cases, its side outputs (late, duplicates); not its dead letters.
func (e Edge) Writes() bool { return e.Kind == EdgeWrites || e.Kind == EdgeSideOutput }

// WrittenTopics returns the names of the topics that some node of the plan writes (outputs, side
// outputs such as an aggregate's late topic, and dead letters), whichever process runs it.
func (p *Plan) WrittenTopics() map[string]bool {
	written := map[string]bool{}
	for _, e := range p.Edges {
		if e.Writes() || e.Kind == EdgeDeadLetter {
			written[strings.TrimPrefix(e.To, "topic.")] = true
		}
	}
	return written
}

// Topic returns the topic with the given name, or nil.
func (p *Plan) Topic(name string) *Topic {
	i := sort.Search(len(p.Topics), func(i int) bool { return p.Topics[i].Name >= name })
	if i < len(p.Topics) && p.Topics[i].Name == name {
		return p.Topics[i]
	}
	return nil
}

// Stage returns the stage with the given name, or nil.
func (p *Plan) Stage(name string) *Stage {
	for _, s := range p.Stages {
		if s.Name == name {
			return s
		}
	}
	return nil
}
