package flow

import (
	"fmt"
	"slices"

	"github.com/hashicorp/hcl/v2"

	"github.com/flowrun/flowrun/flow/expr"
)

// The static half of topic schemas (msgschema.go): once every block is compiled and the graph is
// known, the per-message expressions over msg of each block that reads a topic with a known shape
// are compiled again with that shape (expr.Scope.Msg), and what the shape shows is reported. What
// shape a node's input has:
//
//   - a topic with a schema: the schema's, since every writer validates;
//   - the output of a stage read as stage.NAME whose kind says how it passes messages on
//     (Kind.PassesOn: filter, map): its input's shape, changed so;
//   - a repartition topic: its stage's input's shape, since it passes messages on unchanged;
//   - anything else (a topic without a schema, the output of a go function, an aggregate, a join,
//     a lookup): none, and nothing is checked.
//
// What is checked: the block's attributes that are per-message expressions over msg (where, key,
// set, group_by, a route's case conditions, a sink's topic or subject), and each topic's key
// against its own schema. Not checked: the arguments of an aggregate's functions, a pattern's
// steps, a join's select (over left and right), a table's attributes.

// checkMessageShapes reports what the schemas of the pipeline's topics show of its expressions.
func (c *compiler) checkMessageShapes(stageBlocks map[*Stage]*Block) {
	for _, b := range c.cfg.Topics {
		t := c.topics[b.Name]
		if t != nil && t.Schema != nil && t.Schema.shape != nil {
			c.checkShapedAttributes(topicSpec.Attributes, b.Attributes, t.Schema.shape)
		}
	}
	shapes := &topicShapes{stages: map[string]*Stage{}, known: map[*Topic]*expr.Shape{}, busy: map[*Topic]bool{}}
	for _, s := range c.plan.Stages {
		shapes.stages[s.Name] = s
	}
	for _, s := range c.plan.Stages { // in the plan's order, not the map's: diagnostics in a stable order
		if b := stageBlocks[s]; b != nil {
			if in := shapes.of(s.Input); in != nil {
				c.checkShapedBlock(stageSpec, b, in)
			}
		}
	}
	for i, s := range c.plan.Sinks {
		if i >= len(c.cfg.Sinks) {
			break
		}
		if in := shapes.of(s.Input); in != nil {
			c.checkShapedBlock(sinkSpec, c.cfg.Sinks[i], in)
		}
	}
}

// topicShapes finds, and remembers, what is known of the messages of each topic.
type topicShapes struct {
	stages map[string]*Stage
	known  map[*Topic]*expr.Shape
	busy   map[*Topic]bool // against cycles, which are reported elsewhere
}

// of returns the shape of topic t's messages, nil when nothing is known.
func (ts *topicShapes) of(t *Topic) *expr.Shape {
	if t == nil || ts.busy[t] {
		return nil
	}
	if s, ok := ts.known[t]; ok {
		return s
	}
	ts.busy[t] = true
	defer delete(ts.busy, t)
	var s *expr.Shape
	switch {
	case t.Schema != nil:
		s = t.Schema.shape
	case t.Repartition != nil:
		s = ts.of(t.Repartition.Input)
	case t.Implicit && t.Stage != "":
		if st := ts.stages[t.Stage]; st != nil && st.Spec != nil && st.Spec.PassesOn != nil {
			if in := ts.of(st.Input); in != nil {
				if s = st.Spec.PassesOn(in, st.Config); s != nil && s != in {
					changed := *s
					changed.Origin = fmt.Sprintf("%s as stage %q changes it", in.Origin, st.Name)
					s = &changed
				}
			}
		}
	}
	ts.known[t] = s
	return s
}

// checkShapedBlock checks the expressions of a stage or sink block, and of its nested blocks,
// against the shape of its input's messages.
func (c *compiler) checkShapedBlock(spec *BlockSpec, b *Block, in *expr.Shape) {
	specs := spec.Attributes
	if b.Kind != nil {
		specs = append(slices.Clone(specs), b.Kind.Attributes...)
	}
	c.checkShapedAttributes(specs, b.Attributes, in)
	c.checkShapedNested(b.Blocks, in)
}

func (c *compiler) checkShapedNested(blocks []*Block, in *expr.Shape) {
	for _, nb := range blocks {
		if nb.Spec != nil {
			c.checkShapedAttributes(nb.Spec.Attributes, nb.Attributes, in)
		}
		c.checkShapedNested(nb.Blocks, in)
	}
}

// checkShapedAttributes compiles again, with the shape of msg, the attributes of specs that are
// per-message expressions over msg, and reports what the shape shows: the rest of what compiling
// them says was reported when they were compiled first.
func (c *compiler) checkShapedAttributes(specs []Attribute, attrs hcl.Attributes, in *expr.Shape) {
	for _, spec := range specs {
		a, ok := attrs[spec.Name]
		if !ok || spec.RootsFrom != "" || !slices.Contains(spec.Roots, "msg") {
			continue
		}
		var exprs []hcl.Expression
		switch spec.Type {
		case TypeMessageExpr, TypeMessageBool:
			exprs = []hcl.Expression{a.Expr}
		case TypeMessageFields:
			pairs, diags := hcl.ExprMap(a.Expr)
			if diags.HasErrors() {
				continue
			}
			for _, kv := range pairs {
				exprs = append(exprs, kv.Value)
			}
		default:
			continue
		}
		scope := c.attributeScope(spec)
		scope.Msg = in
		for _, e := range exprs {
			p, diags := expr.Compile(e, scope)
			for _, d := range diags {
				if _, ours := d.Extra.(expr.SchemaDiagnostic); ours {
					c.diags = append(c.diags, d)
				}
			}
			if p != nil {
				c.checkShapedResult(spec, p)
			}
		}
	}
}

// checkShapedResult reports an attribute whose value the shape shows to be of a kind it cannot be:
// a condition that is never a bool, a key that is an object or a list.
func (c *compiler) checkShapedResult(spec Attribute, p *expr.Program) {
	s := p.Shape()
	if s == nil || s.Origin == "" || len(s.Kinds) == 0 {
		return
	}
	var want string
	switch {
	case spec.Type == TypeMessageBool && !slices.Contains(s.Kinds, expr.Bool):
		want = "true or false"
	case isKeyAttribute(spec.Name) && !slices.ContainsFunc(s.Kinds, keyKind):
		want = "a string, a number or a bool (what a key is made of)"
	default:
		return
	}
	kinds := make([]string, len(s.Kinds))
	for i, k := range s.Kinds {
		kinds[i] = k.String()
	}
	where := s.Origin
	if s.Path != "" {
		where += " (" + s.Path + ")"
	}
	c.errorf(p.Range(), "Type mismatch", fmt.Sprintf("%s must be %s, but %s is %s in %s.",
		spec.Name, want, p, joinOr(kinds), where))
}

// isKeyAttribute names the attributes whose value becomes a key.
func isKeyAttribute(name string) bool {
	return name == "key" || name == "group_by" || name == TableKeyAttribute || name == SideKeyAttribute
}

// keyKind reports whether a key can be made of a value of kind k.
func keyKind(k expr.Kind) bool { return k == expr.String || k == expr.Number || k == expr.Bool }

// joinOr names kinds: "a string", "a number or null".
func joinOr(kinds []string) string {
	s := "a"
	if len(kinds) > 0 && kinds[0] == "object" {
		s = "an"
	}
	for i, k := range kinds {
		if i > 0 {
			s += " or"
		}
		s += " " + k
	}
	return s
}
