package expr

import (
	"golang.org/x/text/unicode/norm"
)

// The conversions below follow cty's convert package, which HCL applies to
// operands and function arguments: numbers and bools convert to strings,
// strings convert to numbers (when they parse) and bools ("true", "false",
// "1", "0"), nothing converts to or from lists and objects, and null
// converts to anything (callers reject it where HCL does).

// toNumber converts v for an arithmetic or comparison operand.
func toNumber(v Value) (float64, string) {
	switch v.k {
	case Number:
		return v.n, ""
	case String:
		n, ok := parseNumber(v.s)
		if !ok {
			return 0, "a number is required"
		}
		return n.n, ""
	case Null:
		return 0, "argument must not be null"
	}
	return 0, "number required, but have " + v.typeName()
}

// toStringValue converts v to a string. ok is false for null, lists and objects.
func (v Value) asString() (string, string) {
	switch v.k {
	case String:
		return v.s, ""
	case Number:
		return formatNumber(v), ""
	case Bool:
		if v.boolean() {
			return "true", ""
		}
		return "false", ""
	case Null:
		return "", "value is null"
	}
	return "", "string required, but have " + v.typeName()
}

// toBool converts v for a condition or a logical operand.
func toBool(v Value) (bool, string) {
	switch v.k {
	case Bool:
		return v.boolean(), ""
	case String:
		switch v.s {
		case "true", "1":
			return true, ""
		case "false", "0":
			return false, ""
		}
		return false, "a bool is required"
	case Null:
		return false, "value is null"
	}
	return false, "bool required, but have " + v.typeName()
}

// typeName names v's type like cty's FriendlyName does for the types that
// ToCty produces.
func (v Value) typeName() string {
	switch v.k {
	case List:
		return "tuple"
	case Object:
		return "object"
	}
	return v.k.String()
}

// equal is HCL's ==: no conversion, deep comparison of lists and objects,
// null equals only null.
func equal(a, b Value) bool {
	if a.k != b.k {
		return false
	}
	switch a.k {
	case Null:
		return true
	case Bool:
		return a.n == b.n
	case Number:
		if a.s != "" && b.s != "" {
			return a.s == b.s
		}
		return a.n == b.n
	case String:
		return equalStrings(a.s, b.s)
	case List:
		x, y := a.list(), b.list()
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(ValueOf(x[i]), ValueOf(y[i])) {
				return false
			}
		}
		return true
	case Object:
		x, y := a.object(), b.object()
		if len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !equal(ValueOf(xv), ValueOf(yv)) {
				return false
			}
		}
		return true
	}
	return false
}

// equalStrings compares like cty, which NFC-normalizes every string: two
// spellings of "é" are equal. ASCII strings never need normalizing.
func equalStrings(a, b string) bool {
	if a == b {
		return true
	}
	if isASCII(a) && isASCII(b) {
		return false
	}
	return norm.NFC.String(a) == norm.NFC.String(b)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
