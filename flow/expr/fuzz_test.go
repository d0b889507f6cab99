package expr

import (
	"encoding/json"
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
		_, _ = p.Constant()
		for _, m := range msgs {
			env := &Env{Msg: m, Index: 3}
			v1, err1 := p.Eval(env)
			v2, err2 := p.Eval(env)
			if (err1 == nil) != (err2 == nil) {
				t.Fatalf("%s: evaluation is not repeatable: %v / %v", src, err1, err2)
			}
			if err1 == nil {
				_ = v1.Interface()
				_ = v2.String()
			}
			_, _ = p.EvalBool(env)
			_, _ = p.EvalString(env)
		}
	})
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
	hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
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
