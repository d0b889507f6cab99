package expr

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
)

func mustCompile(t *testing.T, src string, s *Scope) *Program {
	t.Helper()
	p, diags := Compile(parse(t, src), s)
	if diags.HasErrors() {
		t.Fatalf("compile %s: %s", src, diags)
	}
	return p
}

func TestEval(t *testing.T) {
	msg := map[string]any{
		"amount": 150.0, "country": "DE", "id": json.Number("12345678901234567890"), "i": 3,
		"items": []any{map[string]any{"sku": "a"}}, "nothing": nil, "s": "5",
	}
	tests := []struct {
		src  string
		want any
	}{
		{`msg.amount > 100 && msg.country == "DE"`, true},
		{`"5" + 1`, 6.0},
		{`msg.s + 1`, 6.0},
		{`msg.s == 5`, false},
		{`msg.i * 2`, 6.0},
		{`"${msg.amount}"`, 150.0}, // a template of one interpolation keeps the type
		{`"n=${msg.amount / 4}"`, "n=37.5"},
		{`"id-${msg.id}"`, "id-12345678901234567890"},
		{`msg.id`, json.Number("12345678901234567890")},
		{`msg.nothing`, nil},
		{`msg.amount > 100 ? "big" : 1`, "big"},
		{`msg.amount < 100 ? "big" : 1`, "1"},
		{`msg.nothing != null && msg.nothing.x > 1`, false},
		{`msg.items[*].sku`, []any{"a"}},
		{`[for k, v in {b = 1, a = msg.i}: k]`, []any{"a", "b"}},
		{`{for it in msg.items: it.sku => upper(it.sku)}`, map[string]any{"a": "A"}},
		{`"order-${index}"`, "order-7"},
		{`1 / 0 > 1e308`, true},
		{`msg.amount % 0`, 150.0},
		{`try(msg.nope, msg.country)`, "DE"},
		{`can(msg.items[1])`, false},
		{`length("👩‍👩‍👧")`, 1.0},
		{`max(msg.i, 2, msg.s)`, 5.0},
	}
	s := &Scope{Roots: []string{"msg", "index"}, Functions: Functions()}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			p := mustCompile(t, tt.src, s)
			v, err := p.Eval(&Env{Msg: msg, Index: 7})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(v.Interface())
			want, _ := json.Marshal(tt.want)
			if string(got) != string(want) {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
}

func TestEvalErrors(t *testing.T) {
	msg := map[string]any{"amount": 150.0, "items": []any{1.0, 2.0}, "name": "x", "nothing": nil, "zero": 0.0}
	tests := []struct {
		src, err string
	}{
		{`msg.nope`, `test.hcl:1,1-9: msg has no field "nope"`},
		{`msg.amount > 1 && msg.nope`, `test.hcl:1,19-27: msg has no field "nope"`},
		{`msg.items[2]`, `msg.items has no element 2 (it has 2)`},
		{`msg.items[-1]`, `a negative number is not a valid index`},
		{`msg.items.x`, `msg.items is a list, not an object`},
		{`msg.nothing.x`, `msg.nothing is null, so it has no field "x"`},
		{`msg.name * 2`, `test.hcl:1,1-9: unsuitable value for left operand: a number is required`},
		{`msg.zero / msg.zero`, `can't divide zero by zero`},
		{`msg.name ? 1 : 2`, `the condition must be a bool, but it is the string "x"`},
		{`msg.nothing ? 1 : 2`, `the condition is null`},
		{`"x${msg.items}"`, `cannot include a list of 2 elements in a string template`},
		{`"a${msg.nothing}"`, `cannot include null in a string template`},
		{`[for x in msg.amount: x]`, `cannot be used as the collection in a 'for' expression`},
		{`upper(msg.items)`, `invalid value for "str" parameter of upper()`},
		{`try(msg.a, msg.b)`, `no expression succeeded`},
	}
	s := &Scope{Roots: []string{"msg"}, Functions: Functions()}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			p := mustCompile(t, tt.src, s)
			_, err := p.Eval(&Env{Msg: msg})
			var ee *EvalError
			if !errors.As(err, &ee) {
				t.Fatalf("got %v, want an *EvalError", err)
			}
			if !strings.Contains(err.Error(), tt.err) {
				t.Errorf("got %q, want it to contain %q", err, tt.err)
			}
			if ee.Range.Filename != "test.hcl" || ee.Expr == "" {
				t.Errorf("error lacks a range or source: %+v", ee)
			}
		})
	}
}

func TestEvalBoolAndString(t *testing.T) {
	s := &Scope{Roots: []string{"msg"}, Functions: Functions()}
	msg := map[string]any{"flag": "true", "n": 42.0, "f": 1.5, "b": false, "l": []any{}, "nothing": nil}
	for src, want := range map[string]bool{`msg.flag`: true, `msg.b`: false, `msg.n > 1`: true} {
		got, err := mustCompile(t, src, s).EvalBool(&Env{Msg: msg})
		if err != nil || got != want {
			t.Errorf("EvalBool(%s) = %v, %v; want %v", src, got, err, want)
		}
	}
	for _, src := range []string{`msg.n`, `msg.nothing`, `msg.l`} {
		if _, err := mustCompile(t, src, s).EvalBool(&Env{Msg: msg}); err == nil {
			t.Errorf("EvalBool(%s) succeeded", src)
		}
	}
	for src, want := range map[string]string{`msg.n`: "42", `msg.f`: "1.5", `msg.b`: "false", `msg.flag`: "true"} {
		got, err := mustCompile(t, src, s).EvalString(&Env{Msg: msg})
		if err != nil || got != want {
			t.Errorf("EvalString(%s) = %q, %v; want %q", src, got, err, want)
		}
	}
	for _, src := range []string{`msg.nothing`, `msg.l`} {
		if _, err := mustCompile(t, src, s).EvalString(&Env{Msg: msg}); err == nil {
			t.Errorf("EvalString(%s) succeeded", src)
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	p := mustCompile(t, benchWhere, &Scope{Roots: []string{"msg"}, Functions: Functions()})
	env := &Env{Msg: benchMessage()}
	allocs := testing.AllocsPerRun(1000, func() {
		if ok, err := p.EvalBool(env); err != nil || !ok {
			t.Fatal(ok, err)
		}
	})
	if allocs != 0 {
		t.Errorf("EvalBool allocates %v times per run, want 0", allocs)
	}
	key := mustCompile(t, `msg.customer_id`, &Scope{Roots: []string{"msg"}})
	allocs = testing.AllocsPerRun(1000, func() { _, _ = key.EvalString(env) })
	if allocs != 0 {
		t.Errorf("EvalString allocates %v times per run, want 0", allocs)
	}
}

func TestConstant(t *testing.T) {
	s := diffScope()
	p := mustCompile(t, `"${var.name}-${local.high_value * 2}"`, s)
	v, ok := p.Constant()
	if !ok || v.Interface() != "orders-200" {
		t.Errorf("Constant() = %v, %v", v, ok)
	}
	if _, ok := mustCompile(t, `msg.a`, s).Constant(); ok {
		t.Error("msg.a reported constant")
	}
	if _, ok := mustCompile(t, `uuid()`, s).Constant(); ok {
		t.Error("uuid() was folded")
	}
	a, _ := mustCompile(t, `uuid()`, s).Eval(&Env{})
	b, _ := mustCompile(t, `uuid()`, s).Eval(&Env{})
	if a.Interface() == b.Interface() || len(a.Interface().(string)) != 36 {
		t.Errorf("uuid() gave %v and %v", a, b)
	}
}

func TestProgramString(t *testing.T) {
	src := `msg.amount > 100 && msg.country == "DE"`
	p := mustCompile(t, src, &Scope{Roots: []string{"msg"}})
	if p.String() != src {
		t.Errorf("String() = %q", p.String())
	}
	if r := p.Range(); r.Start.Column != 1 || r.End.Column != len(src)+1 {
		t.Errorf("Range() = %v", r)
	}
	withSource := mustCompile(t, src, &Scope{Roots: []string{"msg"}, Source: []byte(src)})
	if withSource.String() != src {
		t.Errorf("String() with Source = %q", withSource.String())
	}
	tpl := mustCompile(t, `"a-${msg.b}-%{if msg.c}x%{endif}"`, &Scope{Roots: []string{"msg"}})
	if !strings.HasPrefix(tpl.String(), `"a-${msg.b}-`) {
		t.Errorf("template String() = %q", tpl.String())
	}
}

func TestDiagnostics(t *testing.T) {
	tests := []struct {
		src     string
		roots   []string
		summary string
		detail  string
		col     int // start column of the subject
	}{
		{`mgs.amount > 1`, []string{"msg"}, "Unknown variable", `Did you mean "msg"?`, 1},
		{`msg.a`, []string{"index"}, "Variable not allowed here", `may only refer to index`, 1},
		{`"x-${msg.a}"`, nil, "Variable not allowed here", `may not refer to per-message values`, 6},
		{`msg.a * var.vat_rat`, []string{"msg"}, "Reference to undeclared input variable", `Did you mean "vat_rate"?`, 9},
		{`msg.a > local.hihg_value`, []string{"msg"}, "Reference to undeclared local value", `Did you mean "high_value"?`, 9},
		{`uper(msg.a)`, []string{"msg"}, "Call to unknown function", `Did you mean "upper"?`, 1},
		{`upper(msg.a, 2)`, []string{"msg"}, "Too many function arguments", `expects only 1`, 14},
		{`lookup(msg.a)`, []string{"msg"}, "Not enough function arguments", `Missing value for "key"`, 13},
		{`"abc" * 2`, []string{"msg"}, "Invalid operand", `a number is required`, 1},
		{`upper(1, 2)`, []string{"msg"}, "Too many function arguments", ``, 10},
		{`msg.a > "abc"`, []string{"msg"}, "Invalid operand", `a number is required`, 9},
		{`(msg.a > 1) + 1`, []string{"msg"}, "Invalid operand", `always a bool`, 1},
		{`msg.a ? 1 : true`, []string{"msg"}, "Inconsistent conditional result types", `number`, 9},
		{`!msg.a || [1]`, []string{"msg"}, "Invalid operand", ``, 11},
		{`abs(msg.a, "x")`, []string{"msg"}, "Too many function arguments", ``, 13},
		{`abs("x") + msg.a`, []string{"msg"}, "Invalid function argument", ``, 6},
		{`{a.b = msg.a}`, []string{"msg"}, "Ambiguous attribute key", ``, 2},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			s := diffScope()
			s.Roots = tt.roots
			_, diags := Compile(parse(t, tt.src), s)
			if !diags.HasErrors() {
				t.Fatalf("no error")
			}
			d := diags[0]
			for _, x := range diags {
				if x.Summary == tt.summary {
					d = x
					break
				}
			}
			if d.Summary != tt.summary || !strings.Contains(d.Detail, tt.detail) {
				t.Errorf("got %q / %q, want %q / ...%q...", d.Summary, d.Detail, tt.summary, tt.detail)
			}
			if d.Subject == nil || d.Subject.Start.Column != tt.col {
				t.Errorf("subject %v, want start column %d", d.Subject, tt.col)
			}
		})
	}
}

func TestDiagnosticsAllAtOnce(t *testing.T) {
	_, diags := Compile(parse(t, `mgs.a + uper(msg.b) + var.nope`), &Scope{Roots: []string{"msg"}, Functions: Functions(),
		Constants: map[string]cty.Value{"var": cty.EmptyObjectVal}})
	if len(diags.Errs()) != 3 {
		t.Errorf("got %d errors, want 3: %s", len(diags.Errs()), diags)
	}
}

func TestFallbackWarning(t *testing.T) {
	_, diags := Compile(parse(t, `regex("[a-z]+", msg.a)`), &Scope{Roots: []string{"msg"}, Functions: Functions()})
	if len(diags) != 1 || diags[0].Severity != hcl.DiagWarning || !strings.Contains(diags[0].Detail, "through cty") {
		t.Fatalf("got %s", diags)
	}
	if diags[0].Subject.Start.Column != 1 {
		t.Errorf("warning subject %v", diags[0].Subject)
	}
	// Natives, constant calls and a caller's own function.
	s := &Scope{Roots: []string{"msg"}, Functions: Functions()}
	for _, src := range []string{`upper(msg.a)`, `regex("a", "abc")`, `format("%s", msg.a)`} {
		if _, diags := Compile(parse(t, src), s); len(diags) != 0 {
			t.Errorf("%s: unexpected %s", src, diags)
		}
	}
	// A caller's function named like a native one is respected.
	s.Functions["upper"] = function.New(&function.Spec{
		Params: []function.Parameter{{Name: "s", Type: cty.String}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			return cty.StringVal("custom"), nil
		},
	})
	p, diags := Compile(parse(t, `upper(msg.a)`), s)
	if len(diags) != 1 || diags[0].Severity != hcl.DiagWarning {
		t.Fatalf("got %s", diags)
	}
	if v, err := p.Eval(&Env{Msg: map[string]any{"a": "x"}}); err != nil || v.Interface() != "custom" {
		t.Errorf("got %v, %v", v, err)
	}
}

func TestJSONSyntax(t *testing.T) {
	src := `{
  "where": "${msg.amount > 100 && msg.country == \"DE\"}",
  "key": "${msg.customer_id}",
  "id": "order-${index}",
  "limit": 42,
  "flag": true,
  "none": null,
  "set": {"total": "${msg.amount * 2}", "country": "${upper(msg.country)}", "${msg.country}_seen": true},
  "list": ["${msg.amount}", 1, "x"],
  "bad": "${mgs.amount}",
  "dup": {"a": 1, "a": 2}
}`
	f, diags := hcljson.Parse([]byte(src), "p.hcl.json")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	attrs, diags := f.Body.JustAttributes()
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	s := &Scope{Roots: []string{"msg", "index"}, Functions: Functions()}
	msg := map[string]any{"amount": 150.0, "country": "DE", "customer_id": "c-1"}
	env := &Env{Msg: msg, Index: 3}
	want := map[string]string{
		"where": `true`, "key": `"c-1"`, "id": `"order-3"`, "limit": `42`, "flag": `true`, "none": `null`,
		"set": `{"DE_seen":true,"country":"DE","total":300}`, "list": `[150,1,"x"]`,
	}
	for name, w := range want {
		p, diags := Compile(attrs[name].Expr, s)
		if diags.HasErrors() {
			t.Errorf("%s: %s", name, diags)
			continue
		}
		v, err := p.Eval(env)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		got, _ := json.Marshal(v.Interface())
		if string(got) != w {
			t.Errorf("%s: got %s, want %s", name, got, w)
		}
		// The same value as hcl's own JSON evaluation.
		cv, cd := attrs[name].Expr.Value(ctyContext(s, msg, 3))
		if cd.HasErrors() || !sameJSON(v.Interface(), FromCty(cv)) {
			t.Errorf("%s: cty gives %#v %s", name, cv, cd)
		}
	}
	_, diags = Compile(attrs["bad"].Expr, s)
	if !diags.HasErrors() || diags[0].Summary != "Unknown variable" {
		t.Fatalf("bad: %s", diags)
	}
	// The subject points into the JSON string: line 10, after `"bad": "${`.
	if sub := diags[0].Subject; sub.Start.Line != 10 || sub.Start.Column != 13 {
		t.Errorf("bad: subject %v", sub)
	}
	if _, diags = Compile(attrs["dup"].Expr, s); !diags.HasErrors() || diags[0].Summary != "Duplicate object attribute" {
		t.Errorf("dup: %s", diags)
	}
}

func TestValueOf(t *testing.T) {
	tests := []struct {
		in   any
		kind Kind
		str  string
	}{
		{nil, Null, "null"}, {true, Bool, "true"}, {int32(-4), Number, "-4"}, {uint64(1) << 60, Number, "1152921504606846976"},
		{int64(-9007199254740993), Number, "-9007199254740993"}, {json.Number("1e3"), Number, "1000"},
		{json.Number("0.1"), Number, "0.1"}, {3.25, Number, "3.25"}, {"s", String, `"s"`},
		{[]string{"a"}, List, `["a"]`}, {map[string]int{"a": 1}, Object, `{"a":1}`},
		{struct {
			A int `json:"a"`
		}{2}, Object, `{"a":2}`}, {[]any(nil), Null, "null"}, {(*int)(nil), Null, "null"},
	}
	for _, tt := range tests {
		v := ValueOf(tt.in)
		if v.Kind() != tt.kind || v.String() != tt.str {
			t.Errorf("ValueOf(%#v) = %v %s, want %v %s", tt.in, v.Kind(), v, tt.kind, tt.str)
		}
	}
}

func TestCtyRoundTrip(t *testing.T) {
	in := map[string]any{"a": []any{1.0, "x", nil, true}, "b": map[string]any{}, "c": json.Number("12345678901234567890"), "d": 0.1}
	out := FromCty(ToCty(in))
	got, _ := json.Marshal(out)
	if string(got) != `{"a":[1,"x",null,true],"b":{},"c":12345678901234567890,"d":0.1}` {
		t.Errorf("round trip gave %s", got)
	}
	if v := ToCty(nil); !v.IsNull() {
		t.Errorf("ToCty(nil) = %#v", v)
	}
}

func TestConcurrentEval(t *testing.T) {
	p := mustCompile(t, `[for it in msg.items: it * index]`, &Scope{Roots: []string{"msg", "index"}})
	done := make(chan error)
	for g := range 4 {
		go func() {
			env := &Env{Msg: map[string]any{"items": []any{1.0, 2.0}}, Index: int64(g)}
			for range 200 {
				v, err := p.Eval(env)
				if err != nil {
					done <- err
					return
				}
				if l := v.Interface().([]any); l[1] != float64(2*g) {
					done <- errors.New("wrong result under concurrency")
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestEnvVarsRoot(t *testing.T) {
	p := mustCompile(t, `headers.trace`, &Scope{Roots: []string{"headers"}})
	v, err := p.Eval(&Env{Vars: map[string]any{"headers": map[string]any{"trace": "t1"}}})
	if err != nil || v.Interface() != "t1" {
		t.Errorf("got %v, %v", v, err)
	}
	if _, err := p.Eval(&Env{}); err == nil {
		t.Error("missing root value did not fail")
	}
}

func TestHugeExponent(t *testing.T) {
	// big.ParseFloat would take seconds on this; float64 says +Inf.
	v := ValueOf(json.Number("1e45678902"))
	if v.Kind() != Number || v.String() != "+Inf" {
		t.Errorf("got %v", v)
	}
	if v, ok := parseNumber("-2.5e-99999999"); !ok || v.n != 0 {
		t.Errorf("got %v %v", v, ok)
	}
}

// An integer is printed by its own shortcut: it must print what AppendFloat prints, up to the
// largest integers a float64 holds exactly and past them.
func TestIntegersPrintAsFloatsDo(t *testing.T) {
	ns := []float64{1, -1, 7, 1002, -1002, 1e15, -1e15, 123456789012345, exactInt - 1, -(exactInt - 1),
		exactInt, exactInt + 2, 1e21, 2.5, -0.5}
	for i := 1; i < 2000; i++ {
		ns = append(ns, float64(i*i*i*7919), -float64(i*104729))
	}
	for _, f := range ns {
		if got, want := string(appendNumber(nil, f)), strconv.FormatFloat(f, 'f', -1, 64); got != want {
			t.Errorf("appendNumber(%v) = %q, want %q", f, got, want)
		}
	}
}

// Field names the field of an expression that is a message's field, and only of such a one: its
// value is the field's as decoded.
func TestField(t *testing.T) {
	s := &Scope{Roots: []string{"msg"}, Functions: Functions()}
	for src, want := range map[string]string{
		`msg.id`: "id", `(msg.id)`: "id",
		`msg.a.b`: "", `msg["id"]`: "", `upper(msg.id)`: "", `"${msg.id}-x"`: "", `msg`: "", `"id"`: "",
		`[for m in [msg] : m.id][0]`: "",
	} {
		field, ok := mustCompile(t, src, s).Field()
		if field != want || ok != (want != "") {
			t.Errorf("Field of %s = %q, %v; want %q", src, field, ok, want)
		}
	}
}
