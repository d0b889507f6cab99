package flow

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/flowrun/flowrun/flow/expr"
)

// Attrs holds the compiled values of a kind's own attributes, with defaults applied, so that a kind's
// implementation reads them by name without knowing HCL. Each getter returns the zero value when the
// attribute is absent and has no default.
type Attrs struct {
	values map[string]any
	blocks map[string][]Attrs
	// declared are the attributes these values were decoded by: reading one that is not declared,
	// or as another type, is a programming error (a misspelt name), which panics at once rather
	// than reading as a silent zero.
	declared map[string]Type
	// refused are the attributes written with a value that was refused (and reported where it was
	// written): they read as unset, and a kind's checks report nothing more of them (KindCheck).
	refused map[string]bool
}

// Field is one entry of an object of per-message expressions, such as one name of a map stage's set.
type Field struct {
	Name string
	Expr *expr.Program
}

// Aggregate is one field of a TypeAggregates attribute: Func over Arg (nil for count), with K for
// top_k and By for max_by and min_by.
type Aggregate struct {
	Name string
	Func string
	Arg  *expr.Program
	K    int
	By   *expr.Program // max_by and min_by: what the message with the largest or smallest is picked by
}

// AggregateFuncs are the functions of an aggregate attribute, with the number of arguments each
// takes: the message expression, and top_k's count or the BY expression of max_by and min_by.
var AggregateFuncs = map[string]int{
	"count": 0, "sum": 1, "min": 1, "max": 1, "avg": 1, "count_distinct": 1, "top_k": 2, "first": 1, "last": 1,
	"max_by": 2, "min_by": 2,
}

// aggregateCountArg are the aggregate functions whose second argument is a constant count (K)
// rather than a per-message expression (By).
var aggregateCountArg = map[string]bool{"top_k": true}

// aggregateUsage shows how to call the aggregate functions whose arguments are not plain, for the
// error that a call has too many or too few.
var aggregateUsage = map[string]string{
	"top_k":  " Such as top_k(msg.sku, 3): the 3 most frequent values.",
	"max_by": " Such as max_by(msg.bidder, msg.price): the bidder of the message with the largest price.",
	"min_by": " Such as min_by(msg.bidder, msg.price): the bidder of the message with the smallest price.",
}

func (a *Attrs) set(name string, v any) {
	if a.values == nil {
		a.values = map[string]any{}
	}
	a.values[name] = v
}

func (a *Attrs) addBlock(name string, b Attrs) {
	if a.blocks == nil {
		a.blocks = map[string][]Attrs{}
	}
	a.blocks[name] = append(a.blocks[name], b)
}

// want panics unless the attribute is declared, with one of the types when any are given.
func (a Attrs) want(name string, types ...Type) {
	if a.declared == nil {
		return // decoded by no declaration: a zero Attrs
	}
	t, ok := a.declared[name]
	if !ok {
		panic(fmt.Sprintf("flow: attribute %q is not declared here", name))
	}
	if len(types) == 0 || slices.Contains(types, t) {
		return
	}
	panic(fmt.Sprintf("flow: attribute %q is a %s, not read that way", name, t.Describe()))
}

// get reads an attribute declared with one of the types; the zero T when it has no value.
func get[T any](a Attrs, name string, types ...Type) T {
	a.want(name, types...)
	v, _ := a.values[name].(T)
	return v
}

// SetDefault gives an attribute a value when it has none, for a kind's Check that derives a
// default from the plan.
func (a *Attrs) SetDefault(name string, v any) {
	if !a.Has(name) {
		a.set(name, v)
	}
}

// Has reports whether the attribute has a value, given or defaulted.
func (a Attrs) Has(name string) bool { a.want(name); _, ok := a.values[name]; return ok }

// Declares reports whether the attributes were decoded by a declaration of name, so that code
// reading the attributes of several kinds (a repartition stage reads its stateful stage's) asks
// before it reads.
func (a Attrs) Declares(name string) bool { _, ok := a.declared[name]; return ok }

// String returns a string attribute.
func (a Attrs) String(name string) string { return get[string](a, name, TypeString) }

// Int returns an integer attribute.
func (a Attrs) Int(name string) int64 { return get[int64](a, name, TypeInteger) }

// Float returns a number attribute.
func (a Attrs) Float(name string) float64 { return get[float64](a, name, TypeNumber) }

// Bool returns a bool attribute.
func (a Attrs) Bool(name string) bool { return get[bool](a, name, TypeBool) }

// Duration returns a duration attribute.
func (a Attrs) Duration(name string) time.Duration { return get[time.Duration](a, name, TypeDuration) }

// Size returns a size attribute, in bytes.
func (a Attrs) Size(name string) Size { return get[Size](a, name, TypeSize) }

// Strings returns a list-of-strings attribute.
func (a Attrs) Strings(name string) []string { return get[[]string](a, name, TypeStringList) }

// StringMap returns a map-of-strings attribute.
func (a Attrs) StringMap(name string) map[string]string {
	return get[map[string]string](a, name, TypeStringMap)
}

// Expr returns a per-message expression attribute.
func (a Attrs) Expr(name string) *expr.Program {
	return get[*expr.Program](a, name, TypeMessageExpr, TypeMessageBool)
}

// Fields returns an object-of-expressions attribute, in source order.
func (a Attrs) Fields(name string) []Field { return get[[]Field](a, name, TypeMessageFields) }

// Topic returns a topic reference attribute.
func (a Attrs) Topic(name string) *Topic { return get[*Topic](a, name, TypeTopicRef, TypeInputRef) }

// Sequence returns a TypeSequence attribute's steps, in order.
func (a Attrs) Sequence(name string) []Step { return get[[]Step](a, name, TypeSequence) }

// Table returns a table reference attribute (TypeTableRef).
func (a Attrs) Table(name string) *Table { return get[*Table](a, name, TypeTableRef) }

// Aggregates returns a TypeAggregates attribute, in the order written.
func (a Attrs) Aggregates(name string) []Aggregate { return get[[]Aggregate](a, name, TypeAggregates) }

// TopicOrChoice returns a TypeTopicOrChoice attribute: its topic, or else its word ("" when unset).
func (a Attrs) TopicOrChoice(name string) (*Topic, string) {
	a.want(name, TypeTopicOrChoice)
	switch v := a.values[name].(type) {
	case *Topic:
		return v, ""
	case string:
		return nil, v
	}
	return nil, ""
}

// retry returns a retry reference attribute; only block attributes have one.
func (a Attrs) retry(name string) (RetryPolicy, bool) {
	v, ok := a.values[name].(RetryPolicy)
	return v, ok
}

// Blocks returns the nested blocks of the given type, in source order.
func (a Attrs) Blocks(name string) []Attrs { return a.blocks[name] }

// Tables lists the tables the stage's kind reads (a lookup's table), none for most stages.
func (s *Stage) Tables() []*Table { return s.Config.tableRefs() }

// tableRefs lists the tables the attributes refer to (a lookup's table), by attribute name.
func (a Attrs) tableRefs() []*Table {
	var out []*Table
	for _, n := range sortedKeys(a.values) {
		if t, ok := a.values[n].(*Table); ok {
			out = append(out, t)
		}
	}
	return out
}

// topics lists every topic the attributes and nested blocks write to, in a stable order: nested blocks
// by type and in source order, then attributes by name (for a route: its cases, then its default).
func (a Attrs) topics() []*Topic {
	var out []*Topic
	for _, t := range a.topicAttrs() {
		out = append(out, t.Topic)
	}
	return out
}

// topicAttrs is topics, each labelled with the name of the attribute that names it.
func (a Attrs) topicAttrs() []KindOutput {
	var names []string
	for n, v := range a.values {
		if _, ok := v.(*Topic); ok && a.declared[n] != TypeInputRef { // an input is read, not written
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []KindOutput
	for _, t := range sortedKeys(a.blocks) {
		for _, b := range a.blocks[t] {
			out = append(out, b.topicAttrs()...)
		}
	}
	for _, n := range names {
		out = append(out, KindOutput{Topic: a.values[n].(*Topic), Label: n})
	}
	return out
}
