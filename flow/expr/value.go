package expr

import (
	"encoding/json"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"
)

// Kind is the dynamic type of a Value. Lists stand for every cty sequence
// type (tuple, list, set) and objects for both objects and maps: once a value
// is plain JSON the distinction is gone.
type Kind uint8

const (
	Null Kind = iota
	Bool
	Number
	String
	List
	Object
)

func (k Kind) String() string {
	switch k {
	case Null:
		return "null"
	case Bool:
		return "bool"
	case Number:
		return "number"
	case String:
		return "string"
	case List:
		return "list"
	case Object:
		return "object"
	}
	return "invalid"
}

// Value is one evaluated value. It is passed and returned by value so that
// comparisons and arithmetic never touch the heap.
//
//   - Bool keeps 0 or 1 in n.
//   - Number keeps its float64 in n. When float64 cannot hold the number
//     exactly (a 20-digit id arriving as json.Number or int64), s keeps its
//     exact decimal text too, in the form cty would print, so that passing it
//     through or converting it to a string does not change its digits.
//   - String keeps its text in s.
//   - List keeps a []any and Object a map[string]any in x. They share memory
//     with the message they came from: nothing here ever mutates them.
type Value struct {
	k Kind
	n float64
	s string
	x any
}

// Kind reports the dynamic type of v.
func (v Value) Kind() Kind { return v.k }

// IsNull reports whether v is null.
func (v Value) IsNull() bool { return v.k == Null }

// Interface converts v back to a JSON-ready Go value: nil, bool, float64,
// string, []any or map[string]any. A number that float64 cannot hold exactly
// comes back as a json.Number with its exact digits.
func (v Value) Interface() any {
	switch v.k {
	case Bool:
		return v.n != 0
	case Number:
		if v.s != "" {
			return json.Number(v.s)
		}
		return v.n
	case String:
		return v.s
	case List, Object:
		return v.x
	}
	return nil
}

// String formats v for debugging; it is not the HCL string conversion.
func (v Value) String() string {
	switch v.k {
	case String:
		return strconv.Quote(v.s)
	case Number, Bool:
		s, _ := v.asString()
		return s
	case Null:
		return "null"
	}
	b, err := json.Marshal(v.x)
	if err != nil {
		return v.k.String()
	}
	return string(b)
}

// Constructors for values computed by the evaluator.

func boolVal(b bool) Value {
	if b {
		return Value{k: Bool, n: 1}
	}
	return Value{k: Bool}
}

func numVal(f float64) Value           { return Value{k: Number, n: f} }
func strVal(s string) Value            { return Value{k: String, s: s} }
func listVal(l []any) Value            { return Value{k: List, x: l} }
func objVal(m map[string]any) Value    { return Value{k: Object, x: m} }
func (v Value) boolean() bool          { return v.n != 0 }
func (v Value) list() []any            { l, _ := v.x.([]any); return l }
func (v Value) object() map[string]any { m, _ := v.x.(map[string]any); return m }

// exactInt is the largest magnitude up to which every integer is a float64.
const exactInt = 1 << 53

// ValueOf wraps a decoded JSON value. It accepts what encoding/json produces
// (with or without UseNumber) and Go's other integer and float types; any
// other type goes through a JSON round trip, as if it had been a message.
func ValueOf(x any) Value {
	switch t := x.(type) {
	case nil:
		return Value{}
	case map[string]any:
		if t == nil {
			return Value{}
		}
		return Value{k: Object, x: x}
	case []any:
		if t == nil {
			return Value{}
		}
		return Value{k: List, x: x}
	case string:
		return strVal(t)
	case float64:
		return numVal(t)
	case bool:
		return boolVal(t)
	case json.Number:
		return numberFromText(string(t))
	case int:
		return intVal(int64(t))
	case int64:
		return intVal(t)
	case int32:
		return numVal(float64(t))
	case int16:
		return numVal(float64(t))
	case int8:
		return numVal(float64(t))
	case uint:
		return uintVal(uint64(t))
	case uint64:
		return uintVal(t)
	case uint32:
		return numVal(float64(t))
	case uint16:
		return numVal(float64(t))
	case uint8:
		return numVal(float64(t))
	case float32:
		return numVal(float64(t))
	case Value:
		return t
	}
	return valueOfOther(x)
}

func intVal(i int64) Value {
	if i > -exactInt && i < exactInt {
		return numVal(float64(i))
	}
	return Value{k: Number, n: float64(i), s: strconv.FormatInt(i, 10)}
}

func uintVal(u uint64) Value {
	if u < exactInt {
		return numVal(float64(u))
	}
	return Value{k: Number, n: float64(u), s: strconv.FormatUint(u, 10)}
}

// valueOfOther handles typed maps and slices (map[string]string, []string,
// ...) by reflection and anything else through encoding/json.
func valueOfOther(x any) Value {
	rv := reflect.ValueOf(x)
	switch rv.Kind() {
	case reflect.Map:
		if rv.Type().Key().Kind() == reflect.String {
			if rv.IsNil() {
				return Value{}
			}
			m := make(map[string]any, rv.Len())
			it := rv.MapRange()
			for it.Next() {
				m[it.Key().String()] = ValueOf(it.Value().Interface()).Interface()
			}
			return objVal(m)
		}
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return Value{}
		}
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			break // []byte marshals as base64, like encoding/json does
		}
		l := make([]any, rv.Len())
		for i := range l {
			l[i] = ValueOf(rv.Index(i).Interface()).Interface()
		}
		return listVal(l)
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return Value{}
		}
		return ValueOf(rv.Elem().Interface())
	case reflect.String:
		return strVal(rv.String())
	case reflect.Bool:
		return boolVal(rv.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return intVal(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return uintVal(rv.Uint())
	case reflect.Float32, reflect.Float64:
		return numVal(rv.Float())
	}
	b, err := json.Marshal(x)
	if err != nil {
		return strVal(err.Error())
	}
	var out any
	if err := decodeJSON(b, &out); err != nil {
		return strVal(err.Error())
	}
	return ValueOf(out)
}

// numberFromText makes a number from decimal text (a json.Number or a
// string being converted). ok is false when cty would not accept the text
// as a number.
func numberFromText(text string) Value {
	v, _ := parseNumber(text)
	return v
}

// parseNumber parses text the way cty.ParseNumberVal does (big.ParseFloat in
// base 10), without allocating for ordinary decimal numbers.
func parseNumber(text string) (Value, bool) {
	if plainDecimal(text) {
		f, err := strconv.ParseFloat(text, 64)
		if err == nil {
			if significantDigits(text) <= 15 {
				return numVal(f), true
			}
			return exactNumber(text)
		}
		// Out of float64 range: cty still has it exactly, unless the
		// exponent is absurd (1e45678902), where big.ParseFloat would spend
		// seconds per message; then it is ±Inf or 0 like float64 says.
		if hugeExponent(text) {
			return numVal(f), true
		}
		return exactNumber(text)
	}
	return exactNumber(text)
}

// hugeExponent reports a decimal exponent beyond ±10000.
func hugeExponent(text string) bool {
	i := strings.IndexAny(text, "eE")
	if i < 0 {
		return false
	}
	exp := strings.TrimLeft(text[i+1:], "+-0")
	return len(exp) > 5 || (len(exp) == 5 && exp > "10000")
}

// exactNumber is the slow path: parse with big.Float like cty does and keep
// the exact text when float64 would lose digits.
func exactNumber(text string) (Value, bool) {
	bf, _, err := big.ParseFloat(text, 10, 512, big.ToNearestEven)
	if err != nil {
		return Value{}, false
	}
	return numberFromBig(bf), true
}

// numberFromBig converts a cty number.
func numberFromBig(bf *big.Float) Value {
	f, acc := bf.Float64()
	if bf.IsInf() {
		return numVal(f)
	}
	if acc == big.Exact {
		return numVal(f)
	}
	if bf.IsInt() {
		return Value{k: Number, n: f, s: bf.Text('f', -1)}
	}
	// A fraction that float64 cannot hold exactly (0.1 parsed at 512 bits):
	// keep the exact text only when it has more digits than float64 keeps.
	t := bf.Text('f', -1)
	if significantDigits(t) <= 15 {
		return numVal(f)
	}
	return Value{k: Number, n: f, s: t}
}

// plainDecimal reports whether text is [-+]?digits[.digits][(e|E)[-+]?digits]
// with at least one mantissa digit: the part of big.ParseFloat's syntax on
// which strconv.ParseFloat agrees.
func plainDecimal(text string) bool {
	i := 0
	if i < len(text) && (text[i] == '+' || text[i] == '-') {
		i++
	}
	digits := 0
	for i < len(text) && text[i] >= '0' && text[i] <= '9' {
		i++
		digits++
	}
	if i < len(text) && text[i] == '.' {
		i++
		for i < len(text) && text[i] >= '0' && text[i] <= '9' {
			i++
			digits++
		}
	}
	if digits == 0 {
		return false
	}
	if i < len(text) && (text[i] == 'e' || text[i] == 'E') {
		i++
		if i < len(text) && (text[i] == '+' || text[i] == '-') {
			i++
		}
		exp := 0
		for i < len(text) && text[i] >= '0' && text[i] <= '9' {
			i++
			exp++
		}
		if exp == 0 {
			return false
		}
	}
	return i == len(text)
}

// significantDigits counts the mantissa digits from the first to the last
// non-zero one. Up to 15 of them survive a trip through float64, so the
// shortest float64 formatting prints the same digits cty would.
func significantDigits(text string) int {
	first, last, pos := -1, -1, 0
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c == 'e' || c == 'E' {
			break
		}
		if c < '0' || c > '9' {
			continue
		}
		if c != '0' {
			if first < 0 {
				first = pos
			}
			last = pos
		}
		pos++
	}
	if first < 0 {
		return 0
	}
	return last - first + 1
}

// formatNumber prints a number the way cty converts numbers to strings:
// shortest round-trip decimal, never in exponent form.
func formatNumber(v Value) string {
	if v.s != "" {
		return v.s
	}
	var buf [32]byte // most numbers' digits: one allocation, the string's
	return string(appendNumber(buf[:0], v.n))
}

func appendNumber(b []byte, f float64) []byte {
	switch {
	case math.IsInf(f, 1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	case f == 0:
		// cty prints negative zero as "-0"; float64 arithmetic produces it
		// in places cty does not, so normalise.
		return append(b, '0')
	case f == math.Trunc(f) && math.Abs(f) < exactInt:
		// An integer, as most keys and ids are: the same digits as
		// AppendFloat's, in a fraction of its time.
		return strconv.AppendInt(b, int64(f), 10)
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}
