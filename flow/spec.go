package flow

import (
	"sort"

	"github.com/hashicorp/hcl/v2"
)

// The language is declared once, as data: every block type, every kind of source, stage and sink, and
// every attribute with its type, default and constraints. Decoding, validation, the JSON Schema and the
// reference documentation are all derived from these declarations, so adding a kind means adding one
// Kind value (and its runtime implementation in package stages).

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
)

// Attribute declares one attribute of a block or kind.
type Attribute struct {
	Name     string
	Type     Type
	Required bool
	// Default is the value used when the attribute is absent, in the Go representation of Type
	// (string, int64, float64, bool, time.Duration, Size); nil means no default.
	Default any
	// DefaultDoc describes a default that depends on other settings, for the docs.
	DefaultDoc string
	Enum       []string // allowed values of a string attribute
	Min        *float64 // inclusive bounds of a number, integer or size (in bytes) attribute
	Max        *float64
	// Roots are the per-message variables a message expression may use, such as "msg" or "index".
	Roots []string
	Doc   string
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
}

// NestedBlock allows a block inside another, between Min and Max times (Max 0: no limit).
type NestedBlock struct {
	Spec     *BlockSpec
	Min, Max int
}

// Kind declares one kind of source, stage or sink: the attributes and blocks it adds to its block type.
type Kind struct {
	Name       string
	Doc        string
	Attributes []Attribute
	Blocks     []NestedBlock
	// OwnOutputs marks a stage kind (route) that writes to the topics its own attributes name, in
	// place of the output attribute.
	OwnOutputs bool
	// Example is a complete block in HCL, shown in the reference docs and checked by the tests.
	Example string
}

// Language is every top-level block type, in the order the reference docs present them.
var Language = []*BlockSpec{
	pipelineSpec,
	variableSpec,
	localsSpec,
	topicSpec,
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
	return append(append([]Attribute(nil), b.Attributes...), k.Attributes...)
}

// blocks returns the block's own nested blocks followed by the kind's, if any.
func (b *BlockSpec) blocks(k *Kind) []NestedBlock {
	if k == nil {
		return b.Blocks
	}
	return append(append([]NestedBlock(nil), b.Blocks...), k.Blocks...)
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

func bound(f float64) *float64 { return &f }
