package expr

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// fromJSON turns an expression from a *.hcl.json file into the equivalent
// native-syntax tree, so that one compiler handles both. In JSON syntax a
// string is a template (also an object key), numbers, bools and null are
// literals, and arrays and objects hold further expressions.
func fromJSON(e hcl.Expression) (hclsyntax.Expression, hcl.Diagnostics) {
	rng := e.Range()
	// With a nil context a JSON expression returns strings verbatim,
	// which tells us its kind without evaluating any template.
	v, diags := e.Value(nil)
	if diags.HasErrors() {
		return nil, diags
	}
	ty := v.Type()
	switch {
	case ty == cty.String && v.IsKnown() && !v.IsNull():
		return jsonTemplate(v.AsString(), rng)
	case ty.IsTupleType() || ty.IsListType():
		items, diags := hcl.ExprList(e)
		if diags.HasErrors() {
			return nil, diags
		}
		out := &hclsyntax.TupleConsExpr{SrcRange: rng, OpenRange: rng}
		for _, it := range items {
			x, d := fromJSON(it)
			diags = append(diags, d...)
			if x != nil {
				out.Exprs = append(out.Exprs, x)
			}
		}
		return out, diags
	case ty.IsObjectType() || ty.IsMapType():
		pairs, diags := hcl.ExprMap(e)
		if diags.HasErrors() {
			return nil, diags
		}
		out := &hclsyntax.ObjectConsExpr{SrcRange: rng, OpenRange: rng}
		seen := map[string]hcl.Range{}
		for _, p := range pairs {
			k, d := fromJSON(p.Key)
			diags = append(diags, d...)
			val, d := fromJSON(p.Value)
			diags = append(diags, d...)
			if k == nil || val == nil {
				continue
			}
			// JSON keys are literal unless they interpolate; a literal
			// key given twice is an error in JSON syntax.
			if lit, ok := k.(*hclsyntax.TemplateExpr); ok && lit.IsStringLiteral() {
				name := lit.Parts[0].(*hclsyntax.LiteralValueExpr).Val.AsString()
				if prev, dup := seen[name]; dup {
					diags = append(diags, errorDiag(p.Key.Range(), "Duplicate object attribute",
						fmt.Sprintf("An attribute named %q was already defined at %s.", name, prev)))
					continue
				}
				seen[name] = p.Key.Range()
			}
			out.Items = append(out.Items, hclsyntax.ObjectConsItem{
				KeyExpr:   &hclsyntax.ObjectConsKeyExpr{Wrapped: k, ForceNonLiteral: true},
				ValueExpr: val,
			})
		}
		return out, diags
	}
	// Numbers, bools and null.
	return &hclsyntax.LiteralValueExpr{Val: v, SrcRange: rng}, nil
}

// jsonTemplate parses a JSON string as a template, positioned one column
// after the opening quote (escapes in the JSON text shift later columns, as
// they do in hcl's own JSON decoder).
func jsonTemplate(s string, rng hcl.Range) (hclsyntax.Expression, hcl.Diagnostics) {
	start := hcl.Pos{Line: rng.Start.Line, Column: rng.Start.Column + 1, Byte: rng.Start.Byte + 1}
	return hclsyntax.ParseTemplate([]byte(s), rng.Filename, start)
}
