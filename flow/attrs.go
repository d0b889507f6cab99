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
}

// Field is one entry of an object of per-message expressions, such as one name of a map stage's set.
type Field struct {
	Name string
	Expr *expr.Program
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
	panic(fmt.Sprintf("flow: attribute %q is a %s, not read that way", name, describeType(t)))
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

// String returns a string attribute.
func (a Attrs) String(name string) string {
	a.want(name, TypeString)
	v, _ := a.values[name].(string)
	return v
}

// Int returns an integer attribute.
func (a Attrs) Int(name string) int64 {
	a.want(name, TypeInteger)
	v, _ := a.values[name].(int64)
	return v
}

// Float returns a number attribute.
func (a Attrs) Float(name string) float64 {
	a.want(name, TypeNumber)
	v, _ := a.values[name].(float64)
	return v
}

// Bool returns a bool attribute.
func (a Attrs) Bool(name string) bool {
	a.want(name, TypeBool)
	v, _ := a.values[name].(bool)
	return v
}

// Duration returns a duration attribute.
func (a Attrs) Duration(name string) time.Duration {
	a.want(name, TypeDuration)
	v, _ := a.values[name].(time.Duration)
	return v
}

// Size returns a size attribute, in bytes.
func (a Attrs) Size(name string) Size {
	a.want(name, TypeSize)
	v, _ := a.values[name].(Size)
	return v
}

// Strings returns a list-of-strings attribute.
func (a Attrs) Strings(name string) []string {
	a.want(name, TypeStringList)
	v, _ := a.values[name].([]string)
	return v
}

// StringMap returns a map-of-strings attribute.
func (a Attrs) StringMap(name string) map[string]string {
	a.want(name, TypeStringMap)
	v, _ := a.values[name].(map[string]string)
	return v
}

// Expr returns a per-message expression attribute.
func (a Attrs) Expr(name string) *expr.Program {
	a.want(name, TypeMessageExpr, TypeMessageBool)
	v, _ := a.values[name].(*expr.Program)
	return v
}

// Fields returns an object-of-expressions attribute, in source order.
func (a Attrs) Fields(name string) []Field {
	a.want(name, TypeMessageFields)
	v, _ := a.values[name].([]Field)
	return v
}

// Topic returns a topic reference attribute.
func (a Attrs) Topic(name string) *Topic {
	a.want(name, TypeTopicRef, TypeInputRef)
	v, _ := a.values[name].(*Topic)
	return v
}

// retry returns a retry reference attribute; only block attributes have one.
func (a Attrs) retry(name string) (RetryPolicy, bool) {
	v, ok := a.values[name].(RetryPolicy)
	return v, ok
}

// Blocks returns the nested blocks of the given type, in source order.
func (a Attrs) Blocks(name string) []Attrs { return a.blocks[name] }

// topics lists every topic the attributes and nested blocks refer to, in a stable order: nested blocks
// by type and in source order, then attributes by name (for a route: its cases, then its default).
func (a Attrs) topics() []*Topic {
	var names []string
	for n, v := range a.values {
		if _, ok := v.(*Topic); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []*Topic
	var blockTypes []string
	for t := range a.blocks {
		blockTypes = append(blockTypes, t)
	}
	sort.Strings(blockTypes)
	for _, t := range blockTypes {
		for _, b := range a.blocks[t] {
			out = append(out, b.topics()...)
		}
	}
	for _, n := range names {
		out = append(out, a.values[n].(*Topic))
	}
	return out
}
