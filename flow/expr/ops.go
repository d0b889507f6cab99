package expr

import (
	"fmt"
	"math"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// Operators follow hclsyntax: arithmetic and ordering convert both operands
// to number (so "5" + 1 is 6), == and != compare without conversion, ! && ||
// convert to bool. Arithmetic runs in float64 where cty uses big.Float; see
// the package documentation.

type opKind uint8

const (
	opAdd opKind = iota
	opSub
	opMul
	opDiv
	opMod
	opLT
	opLE
	opGT
	opGE
	opEq
	opNe
	opAnd
	opOr
)

var opKinds = map[*hclsyntax.Operation]opKind{
	hclsyntax.OpAdd:                opAdd,
	hclsyntax.OpSubtract:           opSub,
	hclsyntax.OpMultiply:           opMul,
	hclsyntax.OpDivide:             opDiv,
	hclsyntax.OpModulo:             opMod,
	hclsyntax.OpLessThan:           opLT,
	hclsyntax.OpLessThanOrEqual:    opLE,
	hclsyntax.OpGreaterThan:        opGT,
	hclsyntax.OpGreaterThanOrEqual: opGE,
	hclsyntax.OpEqual:              opEq,
	hclsyntax.OpNotEqual:           opNe,
	hclsyntax.OpLogicalAnd:         opAnd,
	hclsyntax.OpLogicalOr:          opOr,
}

// checkOperand reports an operand that can never convert to want: a
// constant that does not convert, or a sub-expression whose static type
// does not (a comparison used as a number, a list used as a bool).
func (c *compiler) checkOperand(n *node, want cty.Type, side string, context hcl.Range) {
	wantKind := Bool
	if want == cty.Number {
		wantKind = Number
	}
	if c.checkShapedOperand(n, wantKind, side, context) {
		return
	}
	if n.isConst {
		if n.val.k == Null {
			return // HCL lets null through the conversion; the operation then fails
		}
		if _, err := convert.Convert(toCty(n.val), want); err != nil {
			c.diags = append(c.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Invalid operand",
				Detail:   fmt.Sprintf("Unsuitable value for %s operand: %s.", side, err),
				Subject:  n.rng.Ptr(),
				Context:  context.Ptr(),
			})
		}
		return
	}
	var bad bool
	switch want {
	case cty.Number:
		bad = n.typ == tBool || n.typ == tList || n.typ == tObject
	case cty.Bool:
		bad = n.typ == tNumber || n.typ == tList || n.typ == tObject
	}
	if bad {
		c.diags = append(c.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid operand",
			Detail:   fmt.Sprintf("Unsuitable value for %s operand: %s required, but this is always a %s.", side, want.FriendlyName(), n.typ),
			Subject:  n.rng.Ptr(),
			Context:  context.Ptr(),
		})
	}
}

func (c *compiler) unary(e *hclsyntax.UnaryOpExpr) *node {
	n := c.newNode(e)
	val := c.expr(e.Val)
	switch e.Op {
	case hclsyntax.OpNegate:
		c.checkOperand(val, cty.Number, "unary", e.SrcRange)
		n.typ = tNumber
		n.eval = func(env *Env) (Value, *EvalError) {
			v, err := val.eval(env)
			if err != nil {
				return Value{}, err
			}
			f, msg := toNumber(v)
			if msg != "" {
				return Value{}, val.failf("unsuitable value for unary operand: %s", msg)
			}
			return numVal(-f), nil
		}
	case hclsyntax.OpLogicalNot:
		c.checkOperand(val, cty.Bool, "unary", e.SrcRange)
		n.typ = tBool
		n.eval = func(env *Env) (Value, *EvalError) {
			v, err := val.eval(env)
			if err != nil {
				return Value{}, err
			}
			b, msg := toBool(v)
			if msg != "" {
				return Value{}, val.failf("unsuitable value for unary operand: %s", msg)
			}
			return boolVal(!b), nil
		}
	default:
		c.diags = append(c.diags, errorDiag(e.SrcRange, "Unsupported operator", "This unary operator is not supported."))
		return c.broken(n)
	}
	return n
}

func (c *compiler) binary(e *hclsyntax.BinaryOpExpr) *node {
	n := c.newNode(e)
	op, ok := opKinds[e.Op]
	if !ok {
		c.diags = append(c.diags, errorDiag(e.SrcRange, "Unsupported operator", "This binary operator is not supported."))
		return c.broken(n)
	}
	l, r := c.expr(e.LHS), c.expr(e.RHS)
	switch op {
	case opEq, opNe:
		c.checkShapedEquality(l, r, e.SrcRange)
		n.typ = tBool
		n.eval = equality(l, r, op == opNe)
	case opAnd, opOr:
		c.checkOperand(l, cty.Bool, "left", e.SrcRange)
		c.checkOperand(r, cty.Bool, "right", e.SrcRange)
		n.typ = tBool
		n.eval = logical(n, l, r, op == opAnd)
	case opLT, opLE, opGT, opGE:
		c.checkOperand(l, cty.Number, "left", e.SrcRange)
		c.checkOperand(r, cty.Number, "right", e.SrcRange)
		n.typ = tBool
		n.eval = comparison(n, l, r, op)
	default:
		c.checkOperand(l, cty.Number, "left", e.SrcRange)
		c.checkOperand(r, cty.Number, "right", e.SrcRange)
		n.typ = tNumber
		n.eval = arithmetic(n, l, r, op)
	}
	return n
}

func equality(l, r *node, negate bool) evalFn {
	// Comparing with a constant string is the common case: skip the generic
	// comparison.
	if r.isConst && r.val.k == String && isASCII(r.val.s) {
		want := r.val.s
		return func(env *Env) (Value, *EvalError) {
			a, err := l.eval(env)
			if err != nil {
				return Value{}, err
			}
			return boolVal((a.k == String && a.s == want) != negate), nil
		}
	}
	return func(env *Env) (Value, *EvalError) {
		a, err := l.eval(env)
		if err != nil {
			return Value{}, err
		}
		b, err := r.eval(env)
		if err != nil {
			return Value{}, err
		}
		return boolVal(equal(a, b) != negate), nil
	}
}

// numbers evaluates and converts both operands of a numeric operator.
func numbers(n, l, r *node, env *Env) (float64, float64, *EvalError) {
	a, err := l.eval(env)
	if err != nil {
		return 0, 0, err
	}
	b, err := r.eval(env)
	if err != nil {
		return 0, 0, err
	}
	x, msg := toNumber(a)
	if msg != "" {
		if a.k == Null {
			return 0, 0, n.failf("the left operand is null")
		}
		return 0, 0, l.failf("unsuitable value for left operand: %s", msg)
	}
	y, msg := toNumber(b)
	if msg != "" {
		if b.k == Null {
			return 0, 0, n.failf("the right operand is null")
		}
		return 0, 0, r.failf("unsuitable value for right operand: %s", msg)
	}
	return x, y, nil
}

func comparison(n, l, r *node, op opKind) evalFn {
	// msg.x > 100: compare with a constant number without converting it.
	if r.isConst && r.val.k == Number {
		y := r.val.n
		return func(env *Env) (Value, *EvalError) {
			a, err := l.eval(env)
			if err != nil {
				return Value{}, err
			}
			x := a.n
			if a.k != Number {
				var msg string
				if x, msg = toNumber(a); msg != "" {
					if a.k == Null {
						return Value{}, n.failf("the left operand is null")
					}
					return Value{}, l.failf("unsuitable value for left operand: %s", msg)
				}
			}
			return boolVal(compare(x, y, op)), nil
		}
	}
	return func(env *Env) (Value, *EvalError) {
		x, y, err := numbers(n, l, r, env)
		if err != nil {
			return Value{}, err
		}
		return boolVal(compare(x, y, op)), nil
	}
}

func compare(x, y float64, op opKind) bool {
	switch op {
	case opLT:
		return x < y
	case opLE:
		return x <= y
	case opGT:
		return x > y
	}
	return x >= y
}

func arithmetic(n, l, r *node, op opKind) evalFn {
	return func(env *Env) (Value, *EvalError) {
		x, y, err := numbers(n, l, r, env)
		if err != nil {
			return Value{}, err
		}
		var z float64
		switch op {
		case opAdd:
			z = x + y
		case opSub:
			z = x - y
		case opMul:
			z = x * y
		case opDiv:
			// Like cty: n/0 is ±Inf, 0/0 and Inf/Inf are errors (below).
			z = x / y
		case opMod:
			z = modulo(x, y)
		}
		if math.IsNaN(z) {
			return Value{}, n.failf("the result of this operation is undefined (%s)", undefinedReason(op))
		}
		return numVal(z), nil
	}
}

// modulo follows cty's Value.Modulo: the remainder of truncated division,
// x % 0 is x, and an infinite operand gives x*y.
func modulo(x, y float64) float64 {
	switch {
	case math.IsInf(x, 0) || math.IsInf(y, 0):
		return x * y
	case y == 0:
		return x
	}
	return math.Mod(x, y)
}

func undefinedReason(op opKind) string {
	switch op {
	case opDiv:
		return "can't divide zero by zero or infinity by infinity"
	case opMod:
		return "can't use modulo with zero and infinity"
	case opSub, opAdd:
		return "can't subtract infinity from itself"
	}
	return "can't multiply zero by infinity"
}

// Logical operators.
//
// hclsyntax evaluates both operands of && and || and then lets a decisive
// operand on either side settle the result, dropping the other side's
// errors: false or null for && (cty treats a null bool as false there),
// true for ||. An operand that is not convertible to bool is an error even
// then. So `msg.x != null && msg.x.y > 1` is false, not an error, when
// msg.x is null, and so is `msg.missing && false`.
//
// We short-circuit left to right, which gives the same results: the right
// operand is skipped when the left one decides and the right one cannot
// have a non-bool value (its static type is bool). Otherwise it is
// evaluated to check its type, exactly as HCL does.

type tri uint8

const (
	triFalse tri = iota
	triTrue
	triNull
	triError    // evaluation failed
	triConvFail // a value that does not convert to bool
)

func evalTri(n *node, env *Env) (tri, *EvalError) {
	v, err := n.eval(env)
	if err != nil {
		return triError, err
	}
	if v.k == Bool {
		if v.boolean() {
			return triTrue, nil
		}
		return triFalse, nil
	}
	if v.k == Null {
		return triNull, nil
	}
	b, msg := toBool(v)
	if msg != "" {
		return triConvFail, n.failf("unsuitable value for operand: %s", msg)
	}
	if b {
		return triTrue, nil
	}
	return triFalse, nil
}

func logical(n, l, r *node, and bool) evalFn {
	decisive := func(t tri) bool {
		if and {
			return t == triFalse || t == triNull
		}
		return t == triTrue
	}
	settled := boolVal(!and) // the result a decisive operand gives
	rightIsBool := r.typ == tBool
	return func(env *Env) (Value, *EvalError) {
		a, aerr := evalTri(l, env)
		if a == triConvFail {
			return Value{}, aerr
		}
		if decisive(a) {
			if !rightIsBool {
				if b, berr := evalTri(r, env); b == triConvFail {
					return Value{}, berr
				}
			}
			return settled, nil
		}
		b, berr := evalTri(r, env)
		switch {
		case b == triConvFail:
			return Value{}, berr
		case decisive(b):
			return settled, nil
		case a == triError:
			return Value{}, aerr
		case b == triError:
			return Value{}, berr
		case a == triNull || b == triNull:
			return Value{}, n.failf("an operand of || is null")
		}
		return boolVal(and), nil
	}
}

// Conditional expressions.
//
// HCL evaluates both results and converts the chosen one to a type both
// can convert to (true ? "a" : 1 is "a", false ? "a" : 1 is "1"; a number
// and a bool have no common type). When both results have a static
// primitive type we know the conversion at compile time and evaluate only
// the chosen result. Otherwise both are evaluated, as HCL does; an error in
// the other result is ignored.

func (c *compiler) conditional(e *hclsyntax.ConditionalExpr) *node {
	n := c.newNode(e)
	cond := c.expr(e.Condition)
	yes := c.expr(e.TrueResult)
	no := c.expr(e.FalseResult)
	c.checkOperand(cond, cty.Bool, "condition", e.SrcRange)

	static := isStaticPrimitive(yes.typ) && isStaticPrimitive(no.typ)
	var target styp
	if static {
		var ok bool
		target, ok = unifyStatic(yes.typ, no.typ)
		if !ok {
			c.diags = append(c.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Inconsistent conditional result types",
				Detail:   fmt.Sprintf("The true and false result expressions must have consistent types. The 'true' value is %s, but the 'false' value is %s.", yes.typ, no.typ),
				Subject:  hcl.RangeBetween(e.TrueResult.Range(), e.FalseResult.Range()).Ptr(),
				Context:  e.SrcRange.Ptr(),
			})
			return c.broken(n)
		}
		n.typ = target
	}

	n.eval = func(env *Env) (Value, *EvalError) {
		cv, err := cond.eval(env)
		if err != nil {
			return Value{}, err
		}
		var pick bool
		if cv.k == Bool {
			pick = cv.boolean()
		} else {
			var msg string
			if pick, msg = toBool(cv); msg != "" {
				if cv.k == Null {
					return Value{}, cond.failf("the condition is null; it must be true or false")
				}
				return Value{}, cond.failf("the condition must be a bool, but it is %s", describe(cv))
			}
		}
		chosen, other := yes, no
		if !pick {
			chosen, other = no, yes
		}
		v, err := chosen.eval(env)
		if err != nil {
			return Value{}, err
		}
		if static {
			if v.k != Null && stypOf(v.k) != target {
				return convertPrimitive(chosen, v, target)
			}
			return v, nil
		}
		ov, oerr := other.eval(env)
		if oerr != nil {
			return v, nil // HCL: the other result is unknown, so no conversion
		}
		return unifyResult(chosen, v, ov, pick)
	}
	return n
}

func isStaticPrimitive(t styp) bool {
	return t == tNull || t == tBool || t == tNumber || t == tString
}

// unifyStatic is cty's type unification restricted to primitives: the same
// type, or string when one side is a string; null goes with anything.
func unifyStatic(a, b styp) (styp, bool) {
	switch {
	case a == b:
		return a, true
	case a == tNull:
		return b, true
	case b == tNull:
		return a, true
	case a == tString || b == tString:
		return tString, true
	}
	return tAny, false
}

func convertPrimitive(n *node, v Value, target styp) (Value, *EvalError) {
	switch target {
	case tString:
		s, msg := v.asString()
		if msg != "" {
			return Value{}, n.failf("inconsistent conditional result types: %s", msg)
		}
		return strVal(s), nil
	case tNumber:
		f, msg := toNumber(v)
		if msg != "" {
			return Value{}, n.failf("inconsistent conditional result types: %s", msg)
		}
		return numVal(f), nil
	case tBool:
		b, msg := toBool(v)
		if msg != "" {
			return Value{}, n.failf("inconsistent conditional result types: %s", msg)
		}
		return boolVal(b), nil
	}
	return v, nil
}

// unifyResult converts the chosen result v to the type it shares with the
// other result ov, at run time.
func unifyResult(n *node, v, ov Value, pick bool) (Value, *EvalError) {
	if v.k == Null || ov.k == Null {
		return v, nil
	}
	a, b := stypOf(v.k), stypOf(ov.k)
	if isStaticPrimitive(a) && isStaticPrimitive(b) {
		t, ok := unifyStatic(a, b)
		if !ok {
			return Value{}, n.failf("inconsistent conditional result types: one result is %s, the other %s", a, b)
		}
		if t != a {
			return convertPrimitive(n, v, t)
		}
		return v, nil
	}
	// Lists and objects: let cty decide, it may convert nested values.
	cv, co := toCty(v), toCty(ov)
	if cv.Type().Equals(co.Type()) {
		return v, nil
	}
	tys := []cty.Type{cv.Type(), co.Type()}
	if !pick {
		tys[0], tys[1] = tys[1], tys[0]
	}
	ty, _ := convert.UnifyUnsafe(tys)
	if ty == cty.NilType {
		return Value{}, n.failf("inconsistent conditional result types: one result is %s, the other %s", cv.Type().FriendlyName(), co.Type().FriendlyName())
	}
	out, err := convert.Convert(cv, ty)
	if err != nil {
		return Value{}, n.failf("inconsistent conditional result types: %s", err)
	}
	return fromCty(out), nil
}
