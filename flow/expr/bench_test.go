package expr

import (
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Benchmarks compare compiled evaluation with what a naive runtime pays:
// hclsyntax evaluation through cty, with the message converted to cty once
// per message (BenchmarkCty) or prebuilt (BenchmarkCtyPrebuilt).

const benchWhere = `msg.amount > 100 && msg.country == "DE"`

func benchMessage() map[string]any {
	return map[string]any{
		"amount": 150.0, "country": "DE", "customer_id": "c-42", "id": 1234.0,
		"items": []any{map[string]any{"sku": "x-1", "price": 2.5}},
		"note":  "first order of the day",
	}
}

func benchScope() *Scope {
	return &Scope{
		Roots: []string{"msg", "index"},
		Constants: map[string]cty.Value{
			"var": cty.ObjectVal(map[string]cty.Value{"vat_rate": cty.NumberFloatVal(0.19)}),
		},
		Functions: Functions(),
	}
}

func compileBench(b *testing.B, src string) (*Program, hclsyntax.Expression) {
	e, diags := hclsyntax.ParseExpression([]byte(src), "bench.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	p, diags := Compile(e, benchScope())
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	return p, e
}

func BenchmarkCompiled(b *testing.B) {
	p, _ := compileBench(b, benchWhere)
	env := &Env{Msg: benchMessage()}
	b.ReportAllocs()
	for b.Loop() {
		ok, err := p.EvalBool(env)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

func benchCty(b *testing.B, src string, prebuilt bool) {
	_, e := compileBench(b, src)
	s := benchScope()
	msg := benchMessage()
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"msg": ToCty(msg), "index": cty.NumberIntVal(7), "var": s.Constants["var"]},
		Functions: s.Functions,
	}
	b.ReportAllocs()
	for b.Loop() {
		if !prebuilt {
			ctx.Variables["msg"] = ToCty(msg)
		}
		if _, diags := e.Value(ctx); diags.HasErrors() {
			b.Fatal(diags)
		}
	}
}

func BenchmarkCty(b *testing.B)         { benchCty(b, benchWhere, false) }
func BenchmarkCtyPrebuilt(b *testing.B) { benchCty(b, benchWhere, true) }

// Further shapes: a generator template, a map stage's set of three fields,
// a partition key.
const (
	benchTemplate = `"order-${index}-${msg.customer_id}"`
	benchSet      = `{ total = msg.amount * (1 + var.vat_rate), country = upper(msg.country), sku = msg.items[0].sku }`
	benchKey      = `msg.customer_id`
)

func benchCompiledValue(b *testing.B, src string) {
	p, _ := compileBench(b, src)
	env := &Env{Msg: benchMessage(), Index: 7}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Eval(env); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompiledTemplate(b *testing.B) { benchCompiledValue(b, benchTemplate) }
func BenchmarkCtyTemplate(b *testing.B)      { benchCty(b, benchTemplate, false) }
func BenchmarkCompiledSet(b *testing.B)      { benchCompiledValue(b, benchSet) }
func BenchmarkCtySet(b *testing.B)           { benchCty(b, benchSet, false) }

func BenchmarkCompiledKey(b *testing.B) {
	p, _ := compileBench(b, benchKey)
	env := &Env{Msg: benchMessage()}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.EvalString(env); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCtyKey(b *testing.B) { benchCty(b, benchKey, false) }

// BenchmarkCompiledFallback is a call with no native implementation
// (regex), evaluated through cty for that call.
func BenchmarkCompiledFallback(b *testing.B) { benchCompiledValue(b, `regex("[a-z]+", msg.note)`) }
