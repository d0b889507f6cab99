package expr

import (
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// source returns the source text of e: the exact bytes when Scope.Source
// was given, otherwise a reconstruction from the syntax tree.
func (c *compiler) source(e hclsyntax.Expression) string {
	r := e.Range()
	if src := c.scope.Source; src != nil && r.Start.Byte >= 0 && r.Start.Byte <= r.End.Byte && r.End.Byte <= len(src) {
		return string(src[r.Start.Byte:r.End.Byte])
	}
	var b strings.Builder
	printExpr(&b, e)
	return b.String()
}

// printExpr writes e in canonical native syntax (best effort: comments and
// layout are lost, template directives print as interpolations).
func printExpr(b *strings.Builder, e hclsyntax.Expression) {
	switch e := e.(type) {
	case *hclsyntax.LiteralValueExpr:
		b.WriteString(ctyLiteral(e.Val))
	case *hclsyntax.ScopeTraversalExpr:
		printTraversal(b, e.Traversal)
	case *hclsyntax.RelativeTraversalExpr:
		printExpr(b, e.Source)
		printTraversal(b, e.Traversal)
	case *hclsyntax.IndexExpr:
		printExpr(b, e.Collection)
		b.WriteByte('[')
		printExpr(b, e.Key)
		b.WriteByte(']')
	case *hclsyntax.SplatExpr:
		printExpr(b, e.Source)
		b.WriteString("[*]")
		printExpr(b, e.Each)
	case *hclsyntax.AnonSymbolExpr:
	case *hclsyntax.ParenthesesExpr:
		b.WriteByte('(')
		printExpr(b, e.Expression)
		b.WriteByte(')')
	case *hclsyntax.UnaryOpExpr:
		if e.Op == hclsyntax.OpNegate {
			b.WriteByte('-')
		} else {
			b.WriteByte('!')
		}
		printExpr(b, e.Val)
	case *hclsyntax.BinaryOpExpr:
		printExpr(b, e.LHS)
		b.WriteString(" " + opSymbol(e.Op) + " ")
		printExpr(b, e.RHS)
	case *hclsyntax.ConditionalExpr:
		printExpr(b, e.Condition)
		b.WriteString(" ? ")
		printExpr(b, e.TrueResult)
		b.WriteString(" : ")
		printExpr(b, e.FalseResult)
	case *hclsyntax.TupleConsExpr:
		b.WriteByte('[')
		for i, x := range e.Exprs {
			if i > 0 {
				b.WriteString(", ")
			}
			printExpr(b, x)
		}
		b.WriteByte(']')
	case *hclsyntax.ObjectConsExpr:
		b.WriteByte('{')
		for i, it := range e.Items {
			if i > 0 {
				b.WriteString(", ")
			} else {
				b.WriteByte(' ')
			}
			printExpr(b, it.KeyExpr)
			b.WriteString(" = ")
			printExpr(b, it.ValueExpr)
		}
		if len(e.Items) > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('}')
	case *hclsyntax.ObjectConsKeyExpr:
		if kw := hcl.ExprAsKeyword(e.Wrapped); kw != "" && !e.ForceNonLiteral {
			b.WriteString(kw)
		} else if _, isTpl := e.Wrapped.(*hclsyntax.TemplateExpr); isTpl {
			printExpr(b, e.Wrapped)
		} else {
			b.WriteByte('(')
			printExpr(b, e.Wrapped)
			b.WriteByte(')')
		}
	case *hclsyntax.ForExpr:
		opening, closing := "[", "]"
		if e.KeyExpr != nil {
			opening, closing = "{", "}"
		}
		b.WriteString(opening + "for ")
		if e.KeyVar != "" {
			b.WriteString(e.KeyVar + ", ")
		}
		b.WriteString(e.ValVar + " in ")
		printExpr(b, e.CollExpr)
		b.WriteString(": ")
		if e.KeyExpr != nil {
			printExpr(b, e.KeyExpr)
			b.WriteString(" => ")
		}
		printExpr(b, e.ValExpr)
		if e.Group {
			b.WriteString("...")
		}
		if e.CondExpr != nil {
			b.WriteString(" if ")
			printExpr(b, e.CondExpr)
		}
		b.WriteString(closing)
	case *hclsyntax.FunctionCallExpr:
		b.WriteString(e.Name + "(")
		for i, a := range e.Args {
			if i > 0 {
				b.WriteString(", ")
			}
			printExpr(b, a)
		}
		if e.ExpandFinal {
			b.WriteString("...")
		}
		b.WriteByte(')')
	case *hclsyntax.TemplateExpr:
		b.WriteByte('"')
		for _, p := range e.Parts {
			if lit, ok := p.(*hclsyntax.LiteralValueExpr); ok && lit.Val.Type() == cty.String && !lit.Val.IsNull() {
				q := strconv.Quote(lit.Val.AsString())
				q = strings.ReplaceAll(q[1:len(q)-1], "${", "$${")
				b.WriteString(strings.ReplaceAll(q, "%{", "%%{"))
				continue
			}
			b.WriteString("${")
			printExpr(b, p)
			b.WriteByte('}')
		}
		b.WriteByte('"')
	case *hclsyntax.TemplateWrapExpr:
		b.WriteString(`"${`)
		printExpr(b, e.Wrapped)
		b.WriteString(`}"`)
	case *hclsyntax.TemplateJoinExpr:
		printExpr(b, e.Tuple)
	default:
		b.WriteString("…")
	}
}

// TraversalText writes a traversal as it would be written in a pipeline: msg.items[0].sku.
func TraversalText(t hcl.Traversal) string {
	var b strings.Builder
	printTraversal(&b, t)
	return b.String()
}

func printTraversal(b *strings.Builder, t hcl.Traversal) {
	for _, s := range t {
		switch s := s.(type) {
		case hcl.TraverseRoot:
			b.WriteString(s.Name)
		case hcl.TraverseAttr:
			b.WriteString("." + s.Name)
		case hcl.TraverseIndex:
			b.WriteString("[" + ctyLiteral(s.Key) + "]")
		case hcl.TraverseSplat:
			b.WriteString(".*")
		}
	}
}

func ctyLiteral(v cty.Value) string {
	if !v.IsKnown() {
		return "(unknown)"
	}
	if v.IsNull() {
		return "null"
	}
	if v.Type() == cty.String {
		return strconv.Quote(v.AsString())
	}
	return fromCty(v).String()
}

func opSymbol(op *hclsyntax.Operation) string {
	switch opKinds[op] {
	case opAdd:
		return "+"
	case opSub:
		return "-"
	case opMul:
		return "*"
	case opDiv:
		return "/"
	case opMod:
		return "%"
	case opLT:
		return "<"
	case opLE:
		return "<="
	case opGT:
		return ">"
	case opGE:
		return ">="
	case opEq:
		return "=="
	case opNe:
		return "!="
	case opAnd:
		return "&&"
	}
	return "||"
}
