package flow

import (
	"fmt"
	"sort"

	"github.com/hashicorp/hcl/v2"

	"github.com/flowrun/flowrun/flow/expr"
)

// The language is declared once, as data: every block type, every kind of source, stage and sink, and
// every attribute with its type, default and constraints. Decoding, validation, the JSON Schema and the
// reference documentation are all derived from these declarations. The kinds of sources, stages and
// sinks are declared where they are implemented (package stages) and added with RegisterKind.

// Type is an attribute's type as the language sees it.
type Type int

const (
	TypeString         Type = iota
	TypeNumber              // float64
	TypeInteger             // int64
	TypeBool                // bool
	TypeDuration            // a string such as "250ms" or "5m": time.Duration
	TypeStringList          // []string
	TypeStringMap           // map[string]string
	TypeMessageExpr         // per-message expression: *expr.Program
	TypeMessageBool         // per-message expression that must yield a bool: *expr.Program
	TypeMessageFields       // object of per-message expressions: []Field
	TypeTopicRef            // topic.NAME: *Topic
	TypeInputRef            // topic.NAME or stage.NAME: *Topic
	TypeRetryRef            // retry.NAME: RetryPolicy
	TypeTypeConstraint      // a type expression such as number or list(string): cty.Type
	TypeAny                 // any constant value: cty.Value
	TypeSize                // a string such as "64MiB": Size

	// The types below occur only in the test-file language (package flow/testfile).
	TypeReference       // a block reference whose root is one of Attribute.Refs, such as sink.NAME
	TypeMessages        // a list of message objects
	TypeIntegerList     // a list of whole numbers
	TypeMessageObject   // a per-message expression whose value is a message: *MessageExpr
	TypeMessageExprList // a list of TypeMessageObject
	TypeCondition       // a bool expression over what a test run saw

	// TypeTopicOrChoice is topic.NAME (a *Topic) or one of the attribute's Enum words (a string),
	// such as a dedupe stage's duplicates = "drop" | topic.dupes.
	TypeTopicOrChoice
	// TypeAggregates is an object of aggregate calls over messages, such as
	// { orders = count(), revenue = sum(msg.amount) }: []Aggregate.
	TypeAggregates
	// TypeSequence is a list of named steps, each a condition on a message, such as a pattern's
	// [{ name = "probe", where = msg.amount < 2 }, ...]: []Step (sequence.go).
	TypeSequence
	// TypeTableRef is table.NAME: *Table, a lookup stage's table.
	TypeTableRef
)

// Attribute declares one attribute of a block or kind.
type Attribute struct {
	// Deterministic makes a per-message expression refuse the functions whose value changes from
	// call to call (expr.NonDeterministic): the attributes of stateful kinds.
	Deterministic bool
	Name          string
	Type          Type
	Required      bool
	// Default is the value used when the attribute is absent, in the Go representation of Type
	// (string, int64, float64, bool, time.Duration, Size); nil means no default.
	Default any
	// DefaultDoc describes a default that depends on other settings, for the docs.
	DefaultDoc string
	Enum       []string // allowed values of a string attribute; for a size, words that mean 0 (off)
	Min        *float64 // inclusive bounds of a number, integer or size (in bytes) attribute
	Max        *float64
	// Roots are the per-message variables a message expression may use, such as "msg" or "index".
	Roots []string
	// RootsFrom names a TypeSequence attribute of the same block, declared before this one, whose
	// steps' names are this expression's roots (a pattern's select reads big.amount).
	RootsFrom string
	// Refs are the block types a TypeReference may name, such as "topic" and "stage".
	Refs []string
	Doc  string
}

// BlockSpec declares a block type: its labels, attributes, nested blocks and, for sources, stages
// and sinks, its kinds.
type BlockSpec struct {
	Type       string
	Labels     []string
	Doc        string
	Attributes []Attribute
	Blocks     []NestedBlock
	// FreeForm blocks (locals) take any attribute names.
	FreeForm bool
	// Kinds are the kinds of a source, stage or sink; the kind attribute selects one.
	Kinds []*Kind
	// Unique blocks (pipeline) may appear at most once.
	Unique bool
	// AnyLabel blocks take any non-empty string as their label (a test's run name), not only an
	// identifier that a reference could name.
	AnyLabel bool
}

// NestedBlock allows a block inside another, between Min and Max times (Max 0: no limit).
type NestedBlock struct {
	Spec     *BlockSpec
	Min, Max int
}

// Kind declares one kind of source, stage or sink: the attributes and blocks it adds to its block
// type, and the few checks and graph facts that only the kind knows. Kinds are not declared in this
// package: each registers itself, once, from the file that implements it (package stages), and
// reaches the language through RegisterKind.
type Kind struct {
	Name       string
	Doc        string
	Attributes []Attribute
	Blocks     []NestedBlock
	// Example is a complete block in HCL, shown in the reference docs and checked by the tests.
	Example string

	// OwnOutputs, for a stage kind that writes to the topics its own attributes name (route) in
	// place of the output attribute, lists those topics with a label for graphs. The topics that a
	// kind's other attributes name are its side outputs (Stage.SideOutputs), where it sends some
	// messages in place of its output, such as an aggregate's late = topic.NAME.
	OwnOutputs func(config Attrs) []KindOutput
	// OutputsDoc says in words where such a kind writes: "the outputs of its case blocks and its default".
	OutputsDoc string
	// PassesOn, for a stateless stage kind whose outputs are its input messages with changes that its
	// attributes show (filter, map), returns what its outputs look like given what its inputs look
	// like (in is never nil). Without it nothing is known of its outputs. It lets validate check the
	// expressions that read such a stage's output against the schema of the topic it reads
	// (msgschema.go).
	PassesOn func(in *expr.Shape, config Attrs) *expr.Shape
	// Check, when set, runs once the kind's attributes are decoded: it reports mistakes that span
	// attributes and settles defaults that depend on the plan.
	Check func(c *KindCheck)
	// StateKey, for a stateful kind, names the attribute (a message expression) its state is keyed
	// by, such as an aggregate's group_by; without a value, the state is keyed by the message's key.
	// A stage whose input is keyed otherwise reads a repartition topic (see RepartitionKind).
	StateKey string
	// StateShape, for a stateful kind, lists the attributes and nested blocks besides StateKey
	// whose values say what its state means (an aggregate's window and aggregate set): a change of
	// one of them makes the state kept so far meaningless to the stage, and the runtime refuses it
	// (Plan.StateShapes) unless told to delete the state.
	StateShape []string
	// Detail, when set, says in a few words what a node of this kind does, for graphs ("go stage:
	// acme.score"); without it the graph shows the kind's name.
	Detail func(config Attrs) string
	// Stateful, when set, tells whether a stage of this kind with this configuration keeps state per
	// input partition (stages.RegisterStage sets it from the kind's traits): one process at a time
	// must own such a partition, so the stage's ordering may not be "none".
	Stateful func(config Attrs) bool
	// Results marks a stateful kind whose output carries results of its own, new messages whose
	// event times it sets (an aggregate's windows), rather than the messages it read; the topics
	// its other attributes name (late) get messages it read. It tells the watermarks it passes on
	// (watermarks.go).
	Results bool
	// Delays, when set, returns for a stage of this kind with this configuration that passes
	// messages on later than it reads them, in another order, once something outside its input
	// allows (a lookup with as_of waits for its table's watermark past its as_of time), the event
	// time that a message waits for: the stage holds the watermark it passes on in that time at
	// its earliest waiting message's. nil: it passes messages on as it reads them. A stateful
	// stage after it must read its event time the same way (watermarks.go).
	Delays func(config Attrs) *expr.Program
	// KeepsKey, when set, tells whether a stage of this kind with this configuration passes every
	// message on with the key it arrived with (stages.RegisterStage sets it from the kind's traits:
	// filter, map and route do; a go stage does when its function is registered with
	// stages.KeepsKey). Only after such a stage does the next one fuse (fusion.go): after a stage
	// that may set new keys, the next would see a key's messages from several input partitions at
	// once. Without it, a kind's stages may change keys.
	KeepsKey func(config Attrs) bool
	// Sides, for a stage kind that reads two inputs (a join), names its nested blocks, each of which
	// declares an input, a key and an event_time (SideAttributes), in place of the stage's input. The
	// compiler gives such a stage one repartition topic that every side writes (see sides.go).
	Sides []string
}

// KindOutput is one of the topics a stage kind with OwnOutputs writes to.
type KindOutput struct {
	Topic *Topic
	Label string // why messages go there, for graphs: a condition, or "default"
}

// KindCheck is what a kind's Check sees of its block, and how it reports.
type KindCheck struct {
	Pipeline string // the pipeline's name
	Name     string // the block's name
	Config   *Attrs // the kind's decoded attributes; Check may set defaults with SetDefault
	// Ordering is a stage's ordering, given or defaulted; "" for sources and sinks.
	Ordering Ordering
	// GoFuncs are the Go stage functions of this binary (Options.GoFuncs).
	GoFuncs []string

	block *Block
	c     *compiler
}

// Has reports whether the block sets the attribute itself.
func (k *KindCheck) Has(name string) bool { _, ok := k.block.Attributes[name]; return ok }

// Errorf reports an error at the attribute (or, when the block does not set it, at the block).
//
// It reports nothing at an attribute whose value was refused (a malformed or negative duration, a
// string where a number goes): that was reported where the value is written, and a check of it,
// which reads it as unset, would only report the same mistake again, less clearly. So are Warnf
// and BlockErrorf.
func (k *KindCheck) Errorf(attribute, summary, format string, args ...any) {
	if k.Config.refused[attribute] {
		return
	}
	k.c.errorf(k.rangeOf(attribute), summary, fmt.Sprintf(format, args...))
}

// Warnf reports a warning at the attribute (or, when the block does not set it, at the block).
func (k *KindCheck) Warnf(attribute, summary, format string, args ...any) {
	if k.Config.refused[attribute] {
		return
	}
	k.c.warnf(k.rangeOf(attribute), summary, fmt.Sprintf(format, args...))
}

// BlockErrorf reports an error at an attribute of the block's first nested block of that type, such
// as an aggregate's window { gap }: at the nested block's header when it does not set the attribute.
func (k *KindCheck) BlockErrorf(block, attribute, summary, format string, args ...any) {
	if nested := k.Config.Blocks(block); len(nested) > 0 && nested[0].refused[attribute] {
		return
	}
	k.c.errorf(k.nestedRangeOf(block, attribute), summary, fmt.Sprintf(format, args...))
}

// Secret makes the plan hide s wherever it prints text (Plan.Redact: graphs, logs, errors, dead
// letters), as it hides the values of sensitive variables: a password inside an attribute, such as
// a database's connection string, whether or not it came from a sensitive variable.
func (k *KindCheck) Secret(s string) {
	if len(s) < 4 || k.c.plan == nil {
		return
	}
	k.c.plan.secrets = append(k.c.plan.secrets, s)
	sort.SliceStable(k.c.plan.secrets, func(i, j int) bool { return len(k.c.plan.secrets[i]) > len(k.c.plan.secrets[j]) })
}

func (k *KindCheck) rangeOf(attribute string) hcl.Range {
	if a, ok := k.block.Attributes[attribute]; ok {
		return a.Expr.Range()
	}
	return k.block.DeclRange
}

func (k *KindCheck) nestedRangeOf(block, attribute string) hcl.Range {
	for _, b := range k.block.Blocks {
		if b.Type != block {
			continue
		}
		if a, ok := b.Attributes[attribute]; ok {
			return a.Expr.Range()
		}
		return b.DeclRange
	}
	return k.block.DeclRange
}

// RegisterKind adds a kind to a block type ("source", "stage" or "sink"). It is meant for init
// functions (package stages calls it for every kind it registers) and panics on an unknown block
// type, an empty name or a name registered twice: each is a programming error.
func RegisterKind(blockType string, k *Kind) {
	b := BlockSpecFor(blockType)
	if b == nil || (b != sourceSpec && b != stageSpec && b != sinkSpec) {
		panic(fmt.Sprintf("flow.RegisterKind: %q is not a block type with kinds", blockType))
	}
	if k == nil || k.Name == "" {
		panic("flow.RegisterKind: a kind needs a name")
	}
	if b.Kind(k.Name) != nil {
		panic(fmt.Sprintf("flow.RegisterKind: %s kind %q registered twice", blockType, k.Name))
	}
	for _, a := range k.Attributes {
		if a.Name == "kind" || b.Attribute(a.Name) != nil {
			panic(fmt.Sprintf("flow.RegisterKind: %s kind %q redeclares the block's attribute %q", blockType, k.Name, a.Name))
		}
	}
	// Sorted by name, so that the docs and the schema do not depend on the order of registration.
	i := sort.Search(len(b.Kinds), func(i int) bool { return b.Kinds[i].Name > k.Name })
	b.Kinds = append(b.Kinds[:i], append([]*Kind{k}, b.Kinds[i:]...)...)
}

// Attribute returns the block's own attribute of that name, or nil.
func (b *BlockSpec) Attribute(name string) *Attribute {
	for i := range b.Attributes {
		if b.Attributes[i].Name == name {
			return &b.Attributes[i]
		}
	}
	return nil
}

// Language is every top-level block type, in the order the reference docs present them.
var Language = []*BlockSpec{
	pipelineSpec,
	variableSpec,
	localsSpec,
	topicSpec,
	tableSpec,
	retrySpec,
	sourceSpec,
	stageSpec,
	sinkSpec,
}

// BlockSpecFor returns the declaration of a top-level block type, or nil.
func BlockSpecFor(blockType string) *BlockSpec {
	for _, b := range Language {
		if b.Type == blockType {
			return b
		}
	}
	return nil
}

// Kind returns the named kind of a block type, or nil.
func (b *BlockSpec) Kind(name string) *Kind {
	for _, k := range b.Kinds {
		if k.Name == name {
			return k
		}
	}
	return nil
}

// KindNames lists the kinds of a block type, sorted.
func (b *BlockSpec) KindNames() []string {
	names := make([]string, len(b.Kinds))
	for i, k := range b.Kinds {
		names[i] = k.Name
	}
	sort.Strings(names)
	return names
}

// attributes returns the block's own attributes followed by the kind's, if any.
func (b *BlockSpec) attributes(k *Kind) []Attribute {
	if k == nil {
		return b.Attributes
	}
	var out []Attribute
	for _, a := range b.Attributes {
		if len(k.Sides) > 0 && a.Name == "input" {
			continue // its sides have the inputs
		}
		out = append(out, a)
	}
	return append(out, k.Attributes...)
}

// blocks returns the block's own nested blocks followed by the kind's, if any.
func (b *BlockSpec) blocks(k *Kind) []NestedBlock {
	if k == nil {
		return b.Blocks
	}
	return append(append([]NestedBlock(nil), b.Blocks...), k.Blocks...)
}

// BodySchema is the hcl schema of the block's own attributes and nested blocks (a kind's are not
// included), for decoding a body of this type with hcl: an argument or block that it does not
// declare is then an error with hcl's "did you mean". Required arguments are checked by
// CheckRequired, which can say what each one is for.
func (b *BlockSpec) BodySchema() *hcl.BodySchema { return bodySchema(b.Attributes, b.Blocks) }

// CheckRequired reports the block's own required attributes that content lacks, at hb's header.
func (b *BlockSpec) CheckRequired(hb *hcl.Block, content *hcl.BodyContent) hcl.Diagnostics {
	return checkRequired(hb, b.Attributes, content)
}

// bodySchema is the hcl schema of a block's body for the given kind (nil for blocks without kinds).
func bodySchema(attrs []Attribute, blocks []NestedBlock) *hcl.BodySchema {
	s := &hcl.BodySchema{}
	for _, a := range attrs {
		// Required attributes are checked by checkRequired, which can say what each one is for.
		s.Attributes = append(s.Attributes, hcl.AttributeSchema{Name: a.Name})
	}
	for _, nb := range blocks {
		s.Blocks = append(s.Blocks, hcl.BlockHeaderSchema{Type: nb.Spec.Type, LabelNames: nb.Spec.Labels})
	}
	return s
}

// attribute finds an attribute declaration by name.
func findAttribute(attrs []Attribute, name string) (Attribute, bool) {
	for _, a := range attrs {
		if a.Name == name {
			return a, true
		}
	}
	return Attribute{}, false
}

// Bound makes a number a bound of an attribute (Attribute.Min, Attribute.Max).
func Bound(f float64) *float64 { return &f }
