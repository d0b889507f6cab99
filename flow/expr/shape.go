package expr

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// A Shape is what is known, before any message arrives, about the messages an expression reads:
// the kinds each value may have and, for an object, its fields. It comes from the JSON Schema of
// the topic the messages are read from (package flow). With Scope.Msg set, Compile reports a field
// that no message can have (with a "did you mean"), and an operation that the field's kind cannot
// take: a comparison with == that is always false, a string used as a number or a bool. A field
// whose kind the schema types is never converted implicitly: tonumber(msg.amount) says that the
// conversion is meant.

// Shape describes a value of a message.
type Shape struct {
	// Kinds are the kinds the value may have; empty: any kind.
	Kinds []Kind
	// Fields are an object's known fields.
	Fields map[string]*Shape
	// Closed says that an object has no fields but Fields.
	Closed bool
	// Items describes a list's elements; nil: nothing is known of them.
	Items *Shape
	// Origin says who describes the value, such as `the schema of topic "orders"`, and Path where
	// in it, as a JSON pointer such as /properties/amount.
	Origin, Path string
}

// may reports whether the value may be of kind k.
func (s *Shape) may(k Kind) bool { return len(s.Kinds) == 0 || slices.Contains(s.Kinds, k) }

// only returns the value's kind when it has exactly one and may not be null: what static analysis
// can rely on.
func (s *Shape) only() (styp, bool) {
	if len(s.Kinds) != 1 || s.Kinds[0] == Null {
		return tAny, false
	}
	return stypOf(s.Kinds[0]), true
}

// kinds names the value's kinds for a diagnostic: "a string", "a number or null".
func (s *Shape) kinds() string {
	names := make([]string, len(s.Kinds))
	for i, k := range s.Kinds {
		names[i] = k.String()
	}
	article := "a"
	if len(names) > 0 && names[0] == "object" {
		article = "an"
	}
	return article + " " + strings.Join(names, " or ")
}

// where says where the shape comes from, for a diagnostic: `the schema of topic "orders"
// (/properties/amount)`.
func (s *Shape) where() string {
	if s.Path == "" {
		return s.Origin
	}
	return fmt.Sprintf("%s (%s)", s.Origin, s.Path)
}

// field returns the shape of an object's field and whether the object may have it.
func (s *Shape) field(name string) (*Shape, bool) {
	if f, ok := s.Fields[name]; ok {
		return f, true
	}
	return nil, !s.Closed
}

// Shape returns what is known of the expression's values when it reads the message through a
// Scope.Msg shape (msg.amount, or an expression whose kind is known): nil when nothing is.
func (p *Program) Shape() *Shape {
	if p == nil || p.root == nil {
		return nil
	}
	if p.root.shape != nil {
		return p.root.shape
	}
	if k, ok := p.StaticKind(); ok && k != Null {
		return &Shape{Kinds: []Kind{k}}
	}
	return nil
}

// shapeTraversal follows a traversal of msg through the message's shape: it reports a field that
// the shape has not, and returns the shape of the value the traversal reads (nil when unknown).
func (c *compiler) shapeTraversal(steps []step) *Shape {
	s := c.scope.Msg
	for i := range steps {
		if s == nil {
			return nil
		}
		st := &steps[i]
		name, named := st.name, st.attr
		if !st.attr && st.key.k == String {
			name, named = st.key.s, true
		}
		if !named {
			if !s.may(List) && !s.may(Object) {
				c.shapeError(st.rng, "Unsuitable index", fmt.Sprintf("%s is %s in %s: it has no elements.", st.prev, s.kinds(), s.where()))
				return nil
			}
			s = s.Items
			continue
		}
		if !s.may(Object) {
			c.shapeError(st.rng, "Unsupported attribute", fmt.Sprintf("%s is %s in %s: it has no fields.", st.prev, s.kinds(), s.where()))
			return nil
		}
		f, ok := s.field(name)
		if !ok {
			names := make([]string, 0, len(s.Fields))
			for n := range s.Fields {
				names = append(names, n)
			}
			sort.Strings(names)
			detail := fmt.Sprintf("%s has no field %q: its fields are %s, by %s.", st.prev, name, quoteAll(names), s.where())
			if sug := nameSuggestion(name, names); sug != "" {
				detail = fmt.Sprintf("%s has no field %q in %s. Did you mean %q?", st.prev, name, s.where(), sug)
			}
			c.shapeError(st.rng, "Unknown field", detail)
			return nil
		}
		s = f
	}
	return s
}

// checkShapedOperand reports a value of a known shape used where want (Number or Bool) is needed
// but that the shape says it never is: the schema's kinds are not converted implicitly.
func (c *compiler) checkShapedOperand(n *node, want Kind, side string, context hcl.Range) bool {
	s := n.shape
	if s == nil || len(s.Kinds) == 0 || s.may(want) {
		return false
	}
	detail := fmt.Sprintf("The %s operand must be a %s, but %s is %s in %s.", side, want, n.src, s.kinds(), s.where())
	if want == Number && s.may(String) {
		detail += fmt.Sprintf(" A field the schema types is not converted implicitly: write tonumber(%s) to use it as a number.", n.src)
	}
	c.diags = append(c.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError, Summary: "Type mismatch", Detail: detail, Subject: n.rng.Ptr(), Context: context.Ptr(),
		Extra: SchemaDiagnostic{},
	})
	return true
}

// checkShapedEquality reports an == or != between values that can never be equal because their
// kinds differ (== never converts), when one of them has a known shape: comparing a string field
// with a number is always false.
func (c *compiler) checkShapedEquality(l, r *node, context hcl.Range) {
	if l.shape == nil && r.shape == nil {
		return
	}
	lk, lok := nodeKinds(l)
	rk, rok := nodeKinds(r)
	if !lok || !rok || slices.Contains(lk, Null) || slices.Contains(rk, Null) {
		return // null compares with anything: a test for a missing value
	}
	for _, k := range lk {
		if slices.Contains(rk, k) {
			return
		}
	}
	shaped, other := l, r
	if l.shape == nil {
		shaped, other = r, l
	}
	otherKinds := (&Shape{Kinds: rk}).kinds()
	if other == l {
		otherKinds = (&Shape{Kinds: lk}).kinds()
	}
	detail := fmt.Sprintf("%s is %s in %s, and %s is %s: == never converts, so they are never equal.",
		shaped.src, shaped.shape.kinds(), shaped.shape.where(), other.src, otherKinds)
	if shaped.shape.may(String) && !shaped.shape.may(Number) {
		if ok, _ := nodeKinds(other); slices.Contains(ok, Number) {
			detail += fmt.Sprintf(" Compare tonumber(%s) with it, or compare with a string.", shaped.src)
		}
	}
	c.diags = append(c.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError, Summary: "Type mismatch", Detail: detail, Subject: context.Ptr(), Extra: SchemaDiagnostic{},
	})
}

// nodeKinds returns the kinds a node's values may have, when they are known.
func nodeKinds(n *node) ([]Kind, bool) {
	switch {
	case n.shape != nil && len(n.shape.Kinds) > 0:
		return n.shape.Kinds, true
	case n.isConst:
		return []Kind{n.val.k}, true
	case n.typ != tAny:
		return []Kind{kindOf(n.typ)}, true
	}
	return nil, false
}

// kindOf is stypOf's inverse.
func kindOf(t styp) Kind {
	return [...]Kind{Null, Null, Bool, Number, String, List, Object}[t]
}

// SchemaDiagnostic marks, as a diagnostic's Extra, what Compile reports because of Scope.Msg: a
// caller that compiles an expression again with a shape keeps these and drops the rest, which the
// first compilation reported.
type SchemaDiagnostic struct{}

// shapeError reports a mistake that the message's shape shows.
func (c *compiler) shapeError(rng hcl.Range, summary, detail string) {
	c.diags = append(c.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: rng.Ptr(), Extra: SchemaDiagnostic{}})
}

// quoteAll quotes names for a diagnostic: "a", "b" and "c".
func quoteAll(names []string) string {
	if len(names) == 0 {
		return "no fields"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}
