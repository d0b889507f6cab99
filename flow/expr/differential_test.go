package expr

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// The differential test evaluates every expression on every message both
// compiled and through hclsyntax + cty (the message converted with ToCty),
// and requires the same value or an error from both.

func testMessages() []map[string]any {
	return []map[string]any{
		{
			"amount": 150.0, "country": "DE", "customer_id": "c-42", "vat": 0.19,
			"tags": []any{"a", "b", "c"}, "flag": true, "sflag": "true", "snum": "5", "zero": 0.0,
			"items": []any{
				map[string]any{"sku": "x-1", "price": 2.5, "qty": 2.0},
				map[string]any{"sku": "y-2", "price": 10.0, "qty": 1.0},
			},
			"prices":   map[string]any{"EUR": 10.0, "USD": 11.0},
			"currency": "EUR", "nested": map[string]any{"a": map[string]any{"b": "deep"}},
			"nothing": nil, "empty": "", "text": "  Hello, World  ", "int": 7.0, "neg": -3.5,
			"odd key": "odd", "json": `{"a":[1,2],"b":"x"}`, "list_of_lists": []any{[]any{1.0, 2.0}, []any{3.0}},
			"mixed": []any{1.0, "two", true, nil}, "big": json.Number("12345678901234567890"),
			"i64": int64(9007199254740993), "n": json.Number("42"), "fnum": json.Number("2.50"),
		},
		{
			"amount": 50.0, "country": "fr", "customer_id": 12345.0, "vat": 0.2,
			"tags": []any{}, "flag": false, "sflag": "0", "snum": "abc", "zero": 0.0,
			"items":  []any{},
			"prices": map[string]any{"USD": 5.0}, "currency": "EUR",
			"nested": map[string]any{"a": nil}, "nothing": nil, "empty": "", "text": "x", "int": 0.0, "neg": 0.0,
			"json": `[1, 2`, "list_of_lists": []any{}, "mixed": []any{}, "n": json.Number("-1e3"), "fnum": json.Number("0.1"),
		},
		{
			"amount": "100", "country": nil, "customer_id": nil, "tags": "not-a-list", "flag": "yes",
			"items": map[string]any{"sku": "solo", "price": 1.0, "qty": 3.0}, "prices": nil,
			"currency": 3.0, "nested": "flat", "text": "héllo wörld", "int": -2.0, "neg": -0.5,
			"json": `"just a string"`, "mixed": []any{nil, nil},
		},
		{},
	}
}

var differentialExprs = []string{
	// literals, traversals, indexes
	`msg`, `msg.amount`, `msg.country`, `msg.nope`, `msg.items[0].sku`, `msg.items[1].price`, `msg.items[5]`,
	`msg.items[-1]`, `msg.items[0.5]`, `msg.items["0"].sku`, `msg["odd key"]`, `msg["amount"]`, `msg.nested.a.b`,
	`msg.prices[msg.currency]`, `msg.prices["USD"]`, `msg.tags[0]`, `msg.tags[2]`, `msg.nothing`, `msg.nothing.x`,
	`msg.nothing[0]`, `msg.tags[msg.int - 7]`, `msg.amount.x`, `msg.items.sku`, `msg.tags[null]`, `msg.mixed[3]`,
	`msg.list_of_lists[0][1]`, `msg.prices[1]`, `msg.tags["x"]`, `msg.text[0]`, `msg.big`, `msg.i64`, `msg.n`, `msg.fnum`,
	`index`, `index + 1`,
	// splat
	`msg.items[*].price`, `msg.items[*].sku`, `msg.items[*]`, `msg.nothing[*]`, `msg.tags[*]`, `msg.amount[*]`,
	`msg.items.*.sku`, `msg.list_of_lists[*][0]`, `length(msg.items[*].qty)`,
	// arithmetic and conversions
	`msg.amount * (1 + var.vat_rate)`, `msg.amount + 1`, `msg.snum + 1`, `"5" + 1`, `msg.amount - msg.int`,
	`msg.amount / 4`, `msg.amount / msg.zero`, `msg.zero / msg.zero`, `-msg.amount / msg.zero`, `msg.amount % 7`,
	`msg.neg % 2`, `msg.amount % msg.zero`, `-msg.amount`, `-msg.snum`, `msg.flag + 1`, `msg.country + 1`,
	`msg.nothing + 1`, `1 + msg.nothing`, `msg.int * msg.int`, `msg.tags + 1`, `msg.amount * 2 - 1`, `msg.n * 2`,
	`msg.fnum + 0`, `msg.big + 0`,
	// comparison and equality
	`msg.amount > 100`, `msg.amount >= 150`, `msg.amount < msg.int`, `msg.amount <= "150"`, `msg.snum > 4`,
	`msg.country == "DE"`, `msg.country != "DE"`, `msg.amount == 150`, `msg.amount == "150"`, `msg.nothing == null`,
	`msg.nope == null`, `msg.country == null`, `msg.tags == ["a", "b", "c"]`, `msg.tags == []`, `msg.items[0] == {sku = "x-1", price = 2.5, qty = 2}`,
	`msg.prices == {EUR = 10, USD = 11}`, `msg.mixed == [1, "two", true, null]`, `msg.flag == true`, `msg.sflag == true`,
	`msg.country > 1`, `msg.nothing > 1`, `msg.amount > msg.nope`, `msg.n == 42`, `msg.fnum == 2.5`, `msg.big == msg.big`,
	// logic
	`msg.amount > 100 && msg.country == "DE"`, `msg.amount > 100 || msg.country == "DE"`, `!msg.flag`, `!msg.sflag`,
	`msg.flag && msg.sflag`, `msg.flag || msg.nope`, `msg.nope || true`, `msg.nope && false`, `false && msg.nope`,
	`msg.nothing && true`, `true && msg.nothing`, `msg.nothing || false`, `msg.nothing || true`, `msg.flag && msg.country`,
	`msg.flag || msg.amount`, `msg.nested != null && msg.nested.a != null`, `!msg.nothing`, `!msg.amount`,
	`msg.flag && msg.flag && msg.flag`, `msg.nothing != null && msg.nothing.x > 1`,
	// conditionals
	`msg.amount > 100 ? "big" : "small"`, `msg.amount > 100 ? "big" : msg.amount`, `msg.amount > 100 ? msg.amount : "small"`,
	`msg.flag ? 1 : 0`, `msg.sflag ? 1 : 0`, `msg.nothing ? 1 : 0`, `msg.amount ? 1 : 0`, `msg.flag ? msg.nope : 1`,
	`msg.flag ? 1 : msg.nope`, `msg.flag ? null : 1`, `msg.flag ? msg.tags : []`, `msg.flag ? msg.items[0] : {}`,
	`msg.flag ? [1] : ["a"]`, `msg.flag ? msg.amount : msg.country`, `msg.flag ? msg.flag : msg.amount`,
	`msg.flag ? "x" : true`, `msg.flag ? msg.items : msg.tags`,
	// templates
	`"order-${index}"`, `"${msg.country}-${msg.amount}"`, `"${msg.amount}"`, `"a${msg.flag}b"`, `"x${msg.nothing}"`,
	`"x${msg.tags}"`, `"${msg.vat}"`, `"%{if msg.flag}yes%{else}no%{endif}"`, `"%{for t in msg.tags}${t},%{endfor}"`,
	`"%{for i, it in msg.items}${i}=${it.sku} %{endfor}"`, `"${msg.amount / 3}"`, `"${msg.big}"`, `"${msg.i64}"`,
	`"${msg.n}"`, `"${msg.fnum}"`, "<<EOT\nhello ${msg.country}\nEOT\n", `"${msg.int * 1000000}"`,
	// constructors and for
	`[msg.amount, msg.country]`, `{total = msg.amount * 2, country = upper(msg.country)}`, `{(msg.country) = 1}`,
	`{"k" = msg.nope}`, `{(msg.nothing) = 1}`, `{(msg.amount) = 1}`,
	`[for t in msg.tags: upper(t)]`, `[for i, t in msg.tags: "${i}:${t}"]`, `[for it in msg.items: it.price * it.qty if it.qty > 1]`,
	`{for it in msg.items: it.sku => it.price}`, `{for k, v in msg.prices: lower(k) => v * 2}`, `{for it in msg.items: it.qty => it.sku...}`,
	`{for t in msg.tags: "k" => t}`, `[for x in msg.nothing: x]`, `[for x in msg.amount: x]`, `[for x in msg.tags: x if x]`,
	`[for x in msg.tags: x if null]`, `[for k, v in msg: k]`, `{for k, v in msg.prices: k => v if v > 10}`,
	`[for l in msg.list_of_lists: [for x in l: x * 2]]`, `{for t in msg.tags: t => null}`,
	// functions
	`upper(msg.country)`, `lower(msg.country)`, `upper(msg.amount)`, `upper(msg.nothing)`, `upper(msg.tags)`, `upper(msg.text)`,
	`length(msg.tags)`, `length(msg.country)`, `length(msg.text)`, `length(msg.prices)`, `length(msg.nothing)`, `length(msg.amount)`,
	`contains(msg.tags, "b")`, `contains(msg.tags, "z")`, `contains(msg.mixed, null)`, `contains(msg.country, "D")`,
	`coalesce(msg.nothing, msg.country)`, `coalesce(msg.nothing, msg.amount, "x")`, `coalesce(msg.nothing)`, `coalesce(msg.country, "x")`,
	`format("%s-%d", msg.country, msg.amount)`, `format("%.2f", msg.vat)`, `format("%v", msg.amount)`, `format("%t", msg.flag)`,
	`format("%5d|%-5d|%05d", msg.int, msg.int, msg.int)`, `format("%q", msg.country)`, `format("%s", msg.tags)`, `format("%d", msg.vat)`,
	`format("%s %s", msg.country)`, `format("100%%")`, `format("%v", msg.tags)`, `format("%e", msg.amount)`, `format("%.3e", msg.amount)`,
	`jsonencode(msg.items)`, `jsonencode(msg.prices)`, `jsonencode(msg.country)`, `jsonencode(msg.mixed)`, `jsonencode({a = "<b>"})`,
	`jsondecode(msg.json)`, `jsondecode(msg.country)`, `jsonencode(msg.big)`, `jsonencode(msg.n)`,
	`tostring(msg.amount)`, `tostring(msg.flag)`, `tostring(msg.nothing)`, `tostring(msg.tags)`, `tonumber(msg.snum)`, `tonumber(msg.country)`,
	`tonumber(msg.nothing)`, `tobool(msg.sflag)`, `tobool(msg.country)`, `tobool(msg.nothing)`,
	`concat(msg.tags, ["z"])`, `concat(msg.tags, msg.country)`, `keys(msg.prices)`, `values(msg.prices)`, `keys(msg.tags)`,
	`lookup(msg.prices, "EUR", 0)`, `lookup(msg.prices, "GBP", 0)`, `lookup(msg.prices, msg.currency, -1)`, `lookup(msg.nothing, "a", 1)`,
	`merge(msg.prices, {GBP = 9})`, `merge(msg.prices, msg.nothing)`, `merge(msg.prices, msg.tags)`,
	`abs(msg.neg)`, `ceil(msg.neg)`, `floor(msg.neg)`, `abs(msg.snum)`, `abs(msg.country)`, `min(msg.amount, msg.int, 3)`,
	`max(msg.amount, msg.int, "200")`, `max(msg.nothing, 1)`, `max(msg.tags...)`, `min(msg.items[*].price...)`,
	`trimspace(msg.text)`, `trimprefix(msg.customer_id, "c-")`, `trimsuffix(msg.country, "E")`, `replace(msg.text, "l", "L")`,
	`split(",", "a,b,,c")`, `split(",", msg.country)`, `join("-", msg.tags)`, `join("-", msg.tags, ["x"])`, `join("-", msg.mixed)`,
	`substr(msg.customer_id, 0, 2)`, `substr(msg.customer_id, -2, -1)`, `substr(msg.customer_id, 1, 100)`, `substr(msg.text, 1, 3)`,
	`sum([msg.amount, 2, 3])`, `sum([])`, `sum(["1", 2])`, `sum([null])`, `sum(msg.customer_id)`,
	`substr(msg.customer_id, 10, 1)`, `substr(msg.customer_id, -10, 1)`, `substr(msg.customer_id, 0, 0)`,
	`startswith(msg.customer_id, "c-")`, `endswith(msg.country, "E")`, `strcontains(msg.text, "World")`,
	`regex("[a-z]+", msg.customer_id)`, `regexall("[a-z]", msg.text)`, `title(msg.text)`, `chomp(msg.country)`,
	`sort(msg.tags)`, `reverse(msg.tags)`, `distinct(concat(msg.tags, msg.tags))`, `flatten(msg.list_of_lists)`,
	`element(msg.tags, 4)`, `slice(msg.tags, 0, 2)`, `compact(concat(msg.tags, [""]))`, `zipmap(msg.tags, msg.tags)`,
	`try(msg.nope, msg.country, "x")`, `try(msg.nope, msg.nope2)`, `try(msg.nothing, 1)`, `can(msg.nope)`, `can(msg.items[0].sku)`,
	`can(msg.amount + 1)`, `parseint(msg.snum, 10)`, `pow(msg.int, 2)`, `signum(msg.neg)`, `log(msg.amount, 10)`,
	`upper(format("%s", msg.country))`, `length([for t in msg.tags: t if t != "a"])`,
	`coalesce(msg.nothing, msg.nothing2)`, `toset(msg.tags)`, `tolist(msg.tags)`, `tomap(msg.prices)`,
	// constants and config values
	`var.vat_rate`, `local.high_value`, `msg.amount > local.high_value`, `upper(var.name)`, `"${var.name}-${msg.country}"`,
	`[for x in var.list: x + msg.int]`, `{for k, v in local.map: k => v + msg.int}`,
}

func diffScope() *Scope {
	return &Scope{
		Roots: []string{"msg", "index"},
		Constants: map[string]cty.Value{
			"var": cty.ObjectVal(map[string]cty.Value{
				"vat_rate": cty.NumberFloatVal(0.19), "name": cty.StringVal("orders"),
				"list": cty.ListVal([]cty.Value{cty.NumberIntVal(1), cty.NumberIntVal(2)}),
			}),
			"local": cty.ObjectVal(map[string]cty.Value{
				"high_value": cty.NumberIntVal(100),
				"map":        cty.MapVal(map[string]cty.Value{"a": cty.NumberIntVal(1)}),
			}),
		},
		Functions: Functions(),
	}
}

func ctyContext(s *Scope, msg any, index int64) *hcl.EvalContext {
	vars := map[string]cty.Value{"msg": ToCty(msg), "index": cty.NumberIntVal(index)}
	for k, v := range s.Constants {
		vars[k] = v
	}
	return &hcl.EvalContext{Variables: vars, Functions: s.Functions}
}

func parse(t testing.TB, src string) hclsyntax.Expression {
	t.Helper()
	e, diags := hclsyntax.ParseExpression([]byte(src), "test.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("parse %s: %s", src, diags)
	}
	return e
}

func TestDifferential(t *testing.T) {
	s := diffScope()
	msgs := testMessages()
	compared, bothFailed, skipped := 0, 0, 0
	for _, src := range differentialExprs {
		e := parse(t, src)
		prog, diags := Compile(e, s)
		for mi, msg := range msgs {
			want, wantDiags := e.Value(ctyContext(s, msg, 7))
			if diags.HasErrors() {
				if !wantDiags.HasErrors() && want.IsWhollyKnown() {
					t.Errorf("%s (msg %d): compile error %s, but cty gives %#v", src, mi, diags, want)
				}
				continue
			}
			got, err := prog.Eval(&Env{Msg: msg, Index: 7})
			switch {
			case wantDiags.HasErrors() && err != nil:
				bothFailed++
			case wantDiags.HasErrors():
				t.Errorf("%s (msg %d): got %s, cty fails: %s", src, mi, got, wantDiags)
			case !want.IsWhollyKnown():
				skipped++ // cty has no answer (e.g. an unknown from a dynamic null)
				t.Logf("skipped %s (msg %d): cty gives %#v", src, mi, want)
			case err != nil:
				t.Errorf("%s (msg %d): got error %v, cty gives %#v", src, mi, err, want)
			default:
				compared++
				if !sameJSON(got.Interface(), FromCty(want)) {
					t.Errorf("%s (msg %d): got %s, cty gives %#v", src, mi, got, want)
				}
			}
		}
	}
	t.Logf("%d expressions: %d equal values, %d failed in both, %d skipped", len(differentialExprs), compared, bothFailed, skipped)
}

// sameJSON compares two JSON-ready values; numbers compare by value with a
// relative tolerance for float64-vs-big.Float rounding.
func sameJSON(a, b any) bool {
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if yv, ok := y[k]; !ok || !sameJSON(x[k], yv) {
				return false
			}
		}
		return true
	}
	if an, ok := asFloat(a); ok {
		bn, ok := asFloat(b)
		if !ok {
			return false
		}
		if an == bn {
			return true
		}
		return math.Abs(an-bn) <= 1e-12*math.Max(math.Abs(an), math.Abs(bn))
	}
	return fmt.Sprintf("%T %v", a, a) == fmt.Sprintf("%T %v", b, b)
}

func asFloat(x any) (float64, bool) {
	switch n := x.(type) {
	case float64:
		return n, true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	case int, int64, int32, uint64:
		return ValueOf(n).n, true
	}
	return 0, false
}
