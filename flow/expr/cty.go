package expr

import (
	"math"

	"github.com/zclconf/go-cty/cty"
)

// ToCty converts a decoded JSON value to cty the way ctyjson's implied
// types would: arrays become tuples, objects become objects, and null is a
// null of unknown type. A NaN, which neither JSON nor cty can hold, becomes
// null.
func ToCty(x any) cty.Value {
	return toCty(ValueOf(x))
}

func toCty(v Value) cty.Value {
	switch v.k {
	case Bool:
		return cty.BoolVal(v.boolean())
	case Number:
		if v.s != "" {
			if n, err := cty.ParseNumberVal(v.s); err == nil {
				return n
			}
		}
		if math.IsNaN(v.n) {
			return cty.NullVal(cty.DynamicPseudoType)
		}
		return cty.NumberFloatVal(v.n)
	case String:
		return cty.StringVal(v.s)
	case List:
		l := v.list()
		if len(l) == 0 {
			return cty.EmptyTupleVal
		}
		vals := make([]cty.Value, len(l))
		for i, x := range l {
			vals[i] = ToCty(x)
		}
		return cty.TupleVal(vals)
	case Object:
		m := v.object()
		if len(m) == 0 {
			return cty.EmptyObjectVal
		}
		attrs := make(map[string]cty.Value, len(m))
		for k, x := range m {
			attrs[k] = ToCty(x)
		}
		return cty.ObjectVal(attrs)
	}
	return cty.NullVal(cty.DynamicPseudoType)
}

// FromCty converts a cty value to a JSON-ready Go value (nil, bool, float64
// or json.Number, string, []any, map[string]any). Lists, sets and tuples
// become []any; maps and objects map[string]any. Unknown values, which a
// message never holds, become nil.
func FromCty(v cty.Value) any {
	return fromCty(v).Interface()
}

func fromCty(v cty.Value) Value {
	if v.IsMarked() || v.ContainsMarked() {
		v, _ = v.UnmarkDeep()
	}
	if !v.IsKnown() || v.IsNull() {
		return Value{}
	}
	ty := v.Type()
	switch {
	case ty == cty.Bool:
		return boolVal(v.True())
	case ty == cty.Number:
		return numberFromBig(v.AsBigFloat())
	case ty == cty.String:
		return strVal(v.AsString())
	case ty.IsListType() || ty.IsSetType() || ty.IsTupleType():
		out := make([]any, 0, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			out = append(out, fromCty(e).Interface())
		}
		return listVal(out)
	case ty.IsMapType() || ty.IsObjectType():
		out := make(map[string]any, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			out[k.AsString()] = fromCty(e).Interface()
		}
		return objVal(out)
	}
	return Value{}
}
