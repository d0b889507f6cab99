package expr

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// fuzzScope is diffScope without range(), whose huge constant results only
// slow the fuzzer down.
func fuzzScope() *Scope {
	s := diffScope()
	delete(s.Functions, "range")
	return s
}

// FuzzCompile compiles arbitrary expression source and evaluates it on the
// test messages: nothing may panic, and evaluating twice gives the same
// outcome.
func FuzzCompile(f *testing.F) {
	for _, src := range differentialExprs[:40] {
		f.Add(src)
	}
	s := fuzzScope()
	msgs := testMessages()
	f.Fuzz(func(t *testing.T, src string) {
		e, diags := hclsyntax.ParseExpression([]byte(src), "fuzz.hcl", hcl.InitialPos)
		if diags.HasErrors() {
			return
		}
		p, diags := Compile(e, s)
		if diags.HasErrors() {
			if p != nil {
				t.Fatal("a Program despite errors")
			}
			return
		}
		_ = p.String()
		constant, isConst := p.Constant()
		// uuid() and timestamp() give something new at every call: only whether they fail repeats.
		pure := !hasImpure(e)
		for _, m := range msgs {
			env := &Env{Msg: m, Index: 3}
			v1, err1 := p.Eval(env)
			v2, err2 := p.Eval(env)
			if (err1 == nil) != (err2 == nil) {
				t.Fatalf("%s: evaluation is not repeatable: %v / %v", src, err1, err2)
			}
			if err1 != nil {
				if pure && err1.Error() != err2.Error() {
					t.Fatalf("%s: evaluation is not repeatable: error %q, then %q", src, err1, err2)
				}
			} else {
				_ = v1.Interface()
				_ = v2.String()
				if pure && !sameValue(v1, v2) {
					t.Fatalf("%s: evaluation is not repeatable: %s, then %s", src, v1, v2)
				}
				if isConst && !sameValue(v1, constant) {
					t.Fatalf("%s: evaluates to %s, but its constant is %s", src, v1, constant)
				}
			}
			b1, berr1 := p.EvalBool(env)
			b2, berr2 := p.EvalBool(env)
			if pure && (b1 != b2 || (berr1 == nil) != (berr2 == nil)) {
				t.Fatalf("%s: EvalBool is not repeatable: %v, %v / %v, %v", src, b1, berr1, b2, berr2)
			}
			if pure && err1 == nil && v1.Kind() == Bool && (berr1 != nil || b1 != v1.boolean()) {
				t.Fatalf("%s: EvalBool gives %v, %v for the bool %s", src, b1, berr1, v1)
			}
			s1, serr1 := p.EvalString(env)
			s2, serr2 := p.EvalString(env)
			if pure && (s1 != s2 || (serr1 == nil) != (serr2 == nil)) {
				t.Fatalf("%s: EvalString is not repeatable: %q, %v / %q, %v", src, s1, serr1, s2, serr2)
			}
			if pure && err1 == nil && v1.Kind() == String && (serr1 != nil || s1 != v1.Interface()) {
				t.Fatalf("%s: EvalString gives %q, %v for the string %s", src, s1, serr1, v1)
			}
		}
	})
}

// sameValue tells whether two results are the same value: the same kind, and for numbers the same
// number (NaN being the same as NaN, and an exact decimal the same digits); lists and objects
// element by element. It is exact equality, not the tolerance of the differential tests: one
// program on one message must give the same value every time.
func sameValue(a, b Value) bool {
	if a.Kind() != b.Kind() {
		return false
	}
	return sameJSONExact(a.Interface(), b.Interface())
}

func sameJSONExact(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	case json.Number:
		y, ok := b.(json.Number)
		return ok && x == y
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || math.IsNaN(x) && math.IsNaN(y))
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameJSONExact(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			if yv, ok := y[k]; !ok || !sameJSONExact(xv, yv) {
				return false
			}
		}
		return true
	}
	// Values inside lists and objects that came from a message as it was decoded (json.Number
	// with UseNumber, other numeric types) compare as their Values do.
	va, vb := ValueOf(a), ValueOf(b)
	if va.Kind() != vb.Kind() {
		return false
	}
	if va.Kind() == Number {
		return va.n == vb.n && va.s == vb.s
	}
	return fmt.Sprintf("%T %v", a, a) == fmt.Sprintf("%T %v", b, b)
}

// FuzzEval is differential: an expression and a JSON message, evaluated
// compiled and through cty, must both fail or agree on the value. Results
// that cty leaves unknown, and non-finite numbers, are skipped.
func FuzzEval(f *testing.F) {
	seeds := []struct{ src, msg string }{
		{`msg.a > 1 && msg.b == "x"`, `{"a": 2, "b": "x"}`},
		{`msg.a * 2 + 1`, `{"a": "5"}`},
		{`"${msg.a}-${msg.b}"`, `{"a": 1.5, "b": true}`},
		{`[for x in msg.l: x if x != null]`, `{"l": [1, null, "a"]}`},
		{`{for k, v in msg: k => v}`, `{"a": 1, "b": [2]}`},
		{`msg.l[*].x`, `{"l": [{"x": 1}, {"x": 2}]}`},
		{`msg.c ? msg.a : msg.b`, `{"c": "true", "a": 1, "b": "x"}`},
		{`coalesce(msg.a, msg.b)`, `{"a": null, "b": 3}`},
		{`upper(msg.s)`, `{"s": "straße"}`},
		{`length(msg.s)`, `{"s": "e\u0301"}`},
		{`msg.a == msg.b`, `{"a": [1, {"x": null}], "b": [1, {"x": null}]}`},
		{`msg.x != null && msg.x.y > 1`, `{"x": null}`},
		{`jsonencode(msg)`, `{"a": "<>", "b": 1e3}`},
	}
	for _, s := range seeds {
		f.Add(s.src, s.msg)
	}
	s := fuzzScope()
	f.Fuzz(func(t *testing.T, src, msgJSON string) {
		var msg any
		if err := decodeJSON([]byte(msgJSON), &msg); err != nil {
			return
		}
		e, diags := hclsyntax.ParseExpression([]byte(src), "fuzz.hcl", hcl.InitialPos)
		if diags.HasErrors() || hasImpure(e) {
			return
		}
		p, diags := Compile(e, s)
		want, wantDiags := e.Value(ctyContext(s, msg, 3))
		if diags.HasErrors() {
			return // compile errors are checked by the differential table test
		}
		got, err := p.Eval(&Env{Msg: msg, Index: 3})
		switch {
		case wantDiags.HasErrors() || err != nil:
			if wantDiags.HasErrors() != (err != nil) && !diverges(got, err) {
				t.Fatalf("%s on %s: compiled %v / %v, cty %#v / %s", src, msgJSON, got, err, want, wantDiags)
			}
		case !want.IsWhollyKnown():
		default:
			if !sameJSON(got.Interface(), FromCty(want)) && !diverges(got, nil) {
				gb, _ := json.Marshal(got.Interface())
				t.Fatalf("%s on %s: compiled %s, cty %#v", src, msgJSON, gb, want)
			}
		}
	})
}

func hasImpure(e hclsyntax.Expression) bool {
	found := false
	// The visitor returns no diagnostics, so VisitAll has none to return.
	_ = hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		if c, ok := n.(*hclsyntax.FunctionCallExpr); ok && impure[c.Name] {
			found = true
		}
		return nil
	})
	return found
}

// diverges reports results where a documented difference (float64 versus
// big.Float, infinities) is in play.
func diverges(v Value, err error) bool {
	if err != nil {
		return false
	}
	b, jerr := json.Marshal(v.Interface())
	return jerr != nil || len(b) == 0
}
