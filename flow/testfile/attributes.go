package testfile

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/flowrun/flowrun/flow"
)

// Reading one attribute of a test file's block: one of several exclusive ones, a reference to a
// pipeline's block, or a constant of a type.

// bySource orders attributes of one body as they are written.
func bySource(a, b *hcl.Attribute) int { return cmp.Compare(a.Range.Start.Byte, b.Range.Start.Byte) }

// oneOf returns the one attribute of names that the block sets, or nil after reporting that it
// sets none (when required) or more than one.
func (d *decoder) oneOf(hb *hcl.Block, content *hcl.BodyContent, required bool, names ...string) *hcl.Attribute {
	var set []*hcl.Attribute
	for _, n := range names {
		if a, ok := content.Attributes[n]; ok {
			set = append(set, a)
		}
	}
	slices.SortFunc(set, bySource)
	switch {
	case len(set) == 0 && required:
		d.errorf(hb.DefRange, "Missing argument", "A %s block needs one of %s.", hb.Type, flow.JoinOr(names))
	case len(set) > 1:
		d.errorf(set[1].NameRange, "Conflicting arguments", "A %s block takes one of %s; this one has both %s and %s.",
			hb.Type, flow.JoinOr(names), set[0].Name, set[1].Name)
	case len(set) == 1:
		return set[0]
	}
	return nil
}

// reference reads a bare reference such as sink.out whose block type is one of allowed.
func (d *decoder) reference(a *hcl.Attribute, allowed ...string) (blockRef, bool) {
	examples := make([]string, len(allowed))
	for i, r := range allowed {
		examples[i] = r + ".NAME"
	}
	t, diags := hcl.AbsTraversalForExpr(a.Expr)
	var step hcl.TraverseAttr
	ok := len(t) == 2
	if ok {
		step, ok = t[1].(hcl.TraverseAttr)
	}
	name := step.Name
	if diags.HasErrors() || !ok {
		d.errorf(a.Expr.Range(), "Invalid reference", "%s takes a reference written without quotes, %s.", a.Name, flow.JoinOr(examples))
		return blockRef{}, false
	}
	if root := t.RootName(); !slices.Contains(allowed, root) {
		hint := ""
		if s := flow.Suggest(root, allowed); s != "" {
			hint = fmt.Sprintf(" Did you mean %s.%s?", s, name)
		}
		d.errorf(a.Expr.Range(), "Invalid reference", "%s takes a reference to a %s, written as %s.%s", a.Name, flow.JoinOr(allowed), flow.JoinOr(examples), hint)
		return blockRef{}, false
	}
	return blockRef{Type: t.RootName(), Name: name, Range: a.Expr.Range()}, true
}

// constant evaluates an attribute's constant value; false when it has an error (reported) or is null.
func (d *decoder) constant(a *hcl.Attribute) (cty.Value, bool) {
	v, diags := a.Expr.Value(d.ctx)
	d.diags = append(d.diags, diags...)
	if diags.HasErrors() || v.IsNull() {
		return cty.NilVal, false
	}
	return v, true
}

func (d *decoder) convert(a *hcl.Attribute, ty cty.Type) (cty.Value, bool) {
	v, ok := d.constant(a)
	if !ok {
		return cty.NilVal, false
	}
	out, err := convert.Convert(v, ty)
	if err != nil || !out.IsKnown() || out.IsNull() {
		d.errorf(a.Expr.Range(), fmt.Sprintf("Invalid value for %s", a.Name), "%s takes %s.",
			a.Name, map[cty.Type]flow.Type{cty.String: flow.TypeString, cty.Bool: flow.TypeBool, cty.Number: flow.TypeInteger}[ty].Describe())
		return cty.NilVal, false
	}
	return out, true
}

func (d *decoder) string(a *hcl.Attribute) (string, bool) {
	v, ok := d.convert(a, cty.String)
	if !ok {
		return "", false
	}
	return v.AsString(), true
}

func (d *decoder) bool(a *hcl.Attribute) (bool, bool) {
	v, ok := d.convert(a, cty.Bool)
	return ok && v.True(), ok
}

// integer reads a whole number of at least lowest.
func (d *decoder) integer(a *hcl.Attribute, lowest int) (int, bool) {
	v, ok := d.convert(a, cty.Number)
	if !ok {
		return 0, false
	}
	n, ok := wholeNumber(v)
	if !ok || n < lowest {
		d.errorf(a.Expr.Range(), fmt.Sprintf("Invalid value for %s", a.Name), "%s takes a whole number of at least %d.", a.Name, lowest)
		return 0, false
	}
	return n, true
}

func (d *decoder) duration(a *hcl.Attribute) (time.Duration, bool) {
	s, ok := d.string(a)
	if !ok {
		return 0, false
	}
	dur, err := flow.ParseDuration(s)
	if err != nil {
		d.errorf(a.Expr.Range(), "Invalid duration", "%s: %s.", a.Name, err)
		return 0, false
	}
	return dur, true
}

func (d *decoder) enum(a *hcl.Attribute, values []string) (string, bool) {
	s, ok := d.string(a)
	if !ok {
		return "", false
	}
	if !slices.Contains(values, s) {
		d.errorf(a.Expr.Range(), fmt.Sprintf("Invalid value for %s", a.Name), "%q is not one of %s.%s", s, flow.QuotedList(values), flow.DidYouMean(s, values))
		return "", false
	}
	return s, true
}

// wholeNumber returns a number that fits an int, or false.
func wholeNumber(v cty.Value) (int, bool) {
	if v.IsNull() || !v.IsKnown() || v.Type() != cty.Number {
		return 0, false
	}
	bf := v.AsBigFloat()
	i, acc := bf.Int64()
	if !bf.IsInt() || acc != 0 || i != int64(int(i)) {
		return 0, false
	}
	return int(i), true
}
