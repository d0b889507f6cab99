package expr

import (
	"strings"

	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// template compiles "a-${msg.b}-c": every part converted to a string (null,
// lists and objects are errors, like in HCL). %{if} directives arrive as
// conditional parts and %{for} directives as TemplateJoinExpr parts.
func (c *compiler) template(e *hclsyntax.TemplateExpr) *node {
	n := c.newNode(e)
	n.typ = tString
	parts := make([]*node, len(e.Parts))
	for i, p := range e.Parts {
		parts[i] = c.expr(p)
		if parts[i].isConst && (parts[i].val.k == List || parts[i].val.k == Object || parts[i].val.k == Null) {
			c.diags = append(c.diags, errorDiag(parts[i].rng, "Invalid template interpolation value",
				"Cannot include "+describe(parts[i].val)+" in a string template."))
		}
	}
	n.eval = func(env *Env) (Value, *EvalError) {
		var b strings.Builder
		for _, p := range parts {
			v, err := p.eval(env)
			if err != nil {
				return Value{}, err
			}
			s, msg := v.asString()
			if msg != "" {
				return Value{}, p.failf("cannot include %s in a string template", describe(v))
			}
			b.WriteString(s)
		}
		return strVal(b.String()), nil
	}
	return n
}

// templateJoin concatenates the strings a %{for} directive produced.
func (c *compiler) templateJoin(e *hclsyntax.TemplateJoinExpr) *node {
	n := c.newNode(e)
	n.typ = tString
	tuple := c.expr(e.Tuple)
	n.eval = func(env *Env) (Value, *EvalError) {
		v, err := tuple.eval(env)
		if err != nil {
			return Value{}, err
		}
		var b strings.Builder
		for _, x := range v.list() {
			s, msg := ValueOf(x).asString()
			if msg != "" {
				return Value{}, n.failf("cannot include %s in a string template", describe(ValueOf(x)))
			}
			b.WriteString(s)
		}
		return strVal(b.String()), nil
	}
	return n
}
