package stages

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/flowrun/flowrun/flow"
)

// plan compiles a pipeline whose stages read topic "in"; every stage and topic it declares exists.
func plan(t testing.TB, stagesSrc string) *flow.Plan {
	t.Helper()
	src := `
pipeline "t" {}
topic "in" {}
topic "a" {}
topic "b" {}
topic "rest" {}
source "s" {
  kind   = "stdin"
  output = topic.in
}
` + stagesSrc
	cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, diags := flow.Compile(cfg, flow.Options{GoFuncs: Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return p
}

// checkPlanErrors checks that each block, after a pipeline with a stdin source writing to topic
// "in", makes validate fail with an error containing want.
func checkPlanErrors(t *testing.T, cases []struct{ block, want string }) {
	t.Helper()
	for _, c := range cases {
		src := "pipeline \"t\" {}\ntopic \"in\" {}\nsource \"s\" {\n  kind = \"stdin\"\n  output = topic.in\n}\n" + c.block
		cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{})
		}
		if !diags.HasErrors() || !strings.Contains(diags.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.block, diags, c.want)
		}
	}
}

func processor(t testing.TB, p *flow.Plan, name string) Processor {
	t.Helper()
	proc, err := Compile(p.Stage(name), Env{})
	if err != nil {
		t.Fatal(err)
	}
	return proc
}

func process(t *testing.T, proc Processor, payload string) ([]Output, error) {
	t.Helper()
	m := NewMessage("k", []byte(payload), nil)
	return proc.Process(context.Background(), &m, nil)
}

func payloadOf(t *testing.T, o Output) string {
	t.Helper()
	b, err := o.Message.Payload()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const sinkA = `
sink "out" {
  kind  = "stdout"
  input = topic.a
}
`

func TestMapSetsThenDrops(t *testing.T) {
	p := plan(t, `
stage "m" {
  kind   = "map"
  input  = topic.in
  output = topic.a
  set = {
    total   = msg.amount * 2
    country = upper(msg.country)
    amount  = 0
    doubled = msg.amount * 2
  }
  drop = ["note"]
}
`+sinkA)
	outs, err := process(t, processor(t, p, "m"), `{"amount": 21, "country": "de", "note": "x", "id": 12345678901234567890}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0].Topic != p.Topic("a") || outs[0].Message.Key != "k" {
		t.Fatalf("outputs = %+v", outs)
	}
	// Every expression sees the message as it arrived (doubled uses amount 21, not the 0 set beside it),
	// and the 20-digit id keeps its digits.
	want := `{"amount":0,"country":"DE","doubled":42,"id":12345678901234567890,"total":42}`
	if got := payloadOf(t, outs[0]); got != want {
		t.Fatalf("payload = %s, want %s", got, want)
	}
}

func TestMapWithoutChangesPassesBytesThrough(t *testing.T) {
	p := plan(t, `
stage "m" {
  kind   = "map"
  input  = topic.in
  output = topic.a
}
`+sinkA)
	in := `{"b": 1,   "a": "<x>"}`
	outs, err := process(t, processor(t, p, "m"), in)
	if err != nil || len(outs) != 1 || payloadOf(t, outs[0]) != in {
		t.Fatalf("outs %+v, err %v", outs, err)
	}
}

func TestExpressionErrorsArePermanent(t *testing.T) {
	p := plan(t, `
stage "m" {
  kind   = "map"
  input  = topic.in
  output = topic.a
  set    = { cents = tonumber(msg.amount) * 100 }
}
`+sinkA)
	_, err := process(t, processor(t, p, "m"), `{"amount": "n/a"}`)
	if err == nil || !IsPermanent(err) {
		t.Fatalf("err = %v, want a permanent error", err)
	}
	_, err = process(t, processor(t, p, "m"), `{"other": 1}`)
	if err == nil || !IsPermanent(err) || !strings.Contains(err.Error(), "amount") {
		t.Fatalf("missing field: err = %v", err)
	}
}

func TestMalformedPayloadsArePermanent(t *testing.T) {
	p := plan(t, `
stage "f" {
  kind   = "filter"
  input  = topic.in
  output = topic.a
  where  = true
}
`+sinkA)
	for payload, want := range map[string]string{
		`{"a": `:      "not valid JSON",
		`[1, 2]`:      "JSON array, not an object",
		`42`:          "JSON number, not an object",
		`{"a": 1} {}`: "data after the value",
	} {
		_, err := process(t, processor(t, p, "f"), payload)
		if err == nil || !IsPermanent(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want a permanent error about %q", payload, err, want)
		}
	}
}

func TestFilter(t *testing.T) {
	p := plan(t, `
stage "f" {
  kind   = "filter"
  input  = topic.in
  output = topic.a
  where  = msg.amount > 100 && msg.country == "DE"
}
`+sinkA)
	proc := processor(t, p, "f")
	in := `{"amount": 150, "country": "DE"}`
	outs, err := process(t, proc, in)
	if err != nil || len(outs) != 1 || payloadOf(t, outs[0]) != in {
		t.Fatalf("a matching message: outs %+v, err %v", outs, err)
	}
	if outs, err := process(t, proc, `{"amount": 50, "country": "DE"}`); err != nil || len(outs) != 0 {
		t.Fatalf("a message to drop: outs %+v, err %v", outs, err)
	}
	if _, err := process(t, proc, `{"amount": "lots", "country": "DE"}`); !IsPermanent(err) {
		t.Fatalf("a type error: err %v", err)
	}
}

func TestRoute(t *testing.T) {
	src := `
stage "r" {
  kind  = "route"
  input = topic.in
  case {
    when   = msg.n > 10
    output = topic.a
  }
  case {
    when   = msg.n > 5
    output = topic.b
  }
  %s
}
sink "a" {
  kind  = "stdout"
  input = topic.a
}
sink "b" {
  kind  = "stdout"
  input = topic.b
}
sink "rest" {
  kind  = "stdout"
  input = topic.rest
}
`
	withDefault := plan(t, strings.Replace(src, "%s", "default = topic.rest", 1))
	proc := processor(t, withDefault, "r")
	for payload, want := range map[string]string{`{"n": 20}`: "a", `{"n": 7}`: "b", `{"n": 1}`: "rest"} {
		outs, err := process(t, proc, payload)
		if err != nil || len(outs) != 1 || outs[0].Topic.Name != want {
			t.Errorf("%s went to %+v (%v), want %s", payload, outs, err, want)
		}
	}
	without := plan(t, strings.Replace(src, "%s", "", 1))
	if outs, err := process(t, processor(t, without, "r"), `{"n": 1}`); err != nil || len(outs) != 0 {
		t.Errorf("unmatched without a default: %+v, %v", outs, err)
	}
}

func init() {
	Register("test.split", func(_ context.Context, m Message) ([]Message, error) {
		var out []Message
		for _, item := range m.Value["items"].([]any) {
			out = append(out, Message{Key: item.(string), Value: map[string]any{"item": item}})
		}
		return out, nil
	})
	Register("test.fail", func(_ context.Context, m Message) ([]Message, error) {
		if m.Value["permanent"] == true {
			return nil, Permanent(errors.New("rejected"))
		}
		return nil, errors.New("try again")
	})
	Register("test.panic", func(context.Context, Message) ([]Message, error) { panic("boom") })
}

func TestGoStage(t *testing.T) {
	p := plan(t, `
stage "split" {
  kind   = "go"
  func   = "test.split"
  input  = topic.in
  output = topic.a
}
stage "fail" {
  kind   = "go"
  func   = "test.fail"
  input  = topic.in
  output = topic.b
}
stage "panic" {
  kind   = "go"
  func   = "test.panic"
  input  = topic.in
  output = topic.rest
}
`+sinkA+`
sink "b" {
  kind  = "stdout"
  input = topic.b
}
sink "rest" {
  kind  = "stdout"
  input = topic.rest
}
`)
	outs, err := process(t, processor(t, p, "split"), `{"items": ["x", "y"]}`)
	if err != nil || len(outs) != 2 || outs[1].Message.Key != "y" || payloadOf(t, outs[1]) != `{"item":"y"}` {
		t.Fatalf("split: %+v, %v", outs, err)
	}
	if _, err := process(t, processor(t, p, "fail"), `{}`); err == nil || IsPermanent(err) {
		t.Fatalf("a transient error: %v", err)
	}
	if _, err := process(t, processor(t, p, "fail"), `{"permanent": true}`); !IsPermanent(err) {
		t.Fatalf("a permanent error: %v", err)
	}
	if _, err := process(t, processor(t, p, "panic"), `{}`); !IsPermanent(err) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("a panic: %v", err)
	}
}

func init() {
	Register("test.same_key", func(_ context.Context, m Message) ([]Message, error) { return []Message{m}, nil }, KeepsKey())
}

// Filter, map and route keep their messages' keys, and so does a go stage whose function is
// registered with KeepsKey; a function registered without it may change them, as the aggregate
// (whose results are keyed by group) and the dedupe do. The language sees it (flow.Kind.KeepsKey).
func TestWhichStagesKeepKeys(t *testing.T) {
	p := plan(t, `
stage "same" {
  kind   = "go"
  func   = "test.same_key"
  input  = topic.in
  output = topic.a
}
stage "split" {
  kind   = "go"
  func   = "test.split"
  input  = topic.in
  output = topic.b
}
stage "f" {
  kind   = "filter"
  input  = topic.in
  output = topic.rest
  where  = true
}
`+sinkA+`
sink "b" {
  kind  = "stdout"
  input = topic.b
}
sink "rest" {
  kind  = "stdout"
  input = topic.rest
}
`)
	for name, want := range map[string]bool{"same": true, "split": false, "f": true} {
		s := p.Stage(name)
		k, err := StageKindOf(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := k.TraitsFor(s.Config).KeepsKey; got != want {
			t.Errorf("stage %s keeps keys: %v, want %v", name, got, want)
		}
		if got := s.Spec.KeepsKey(s.Config); got != want {
			t.Errorf("the language says stage %s keeps keys: %v, want %v", name, got, want)
		}
	}
	for kind, want := range map[string]bool{"map": true, "route": true, "filter": true, "aggregate": false, "dedupe": true} {
		k, err := StageKindOf(&flow.Stage{Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		if k.Traits.KeepsKey != want {
			t.Errorf("kind %s keeps keys: %v, want %v", kind, k.Traits.KeepsKey, want)
		}
	}
	if !FuncKeepsKey("test.same_key") || FuncKeepsKey("test.split") || FuncKeepsKey("test.total") || FuncKeepsKey("no.such") {
		t.Error("FuncKeepsKey does not report what the registrations declared")
	}
}

func TestRegisterRefusesMistakes(t *testing.T) {
	for name, fn := range map[string]Func{"": func(context.Context, Message) ([]Message, error) { return nil, nil }, "test.nil": nil, "test.split": func(context.Context, Message) ([]Message, error) { return nil, nil }} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", name)
				}
			}()
			Register(name, fn)
		}()
	}
}

func BenchmarkFilterOnRawPayload(b *testing.B) {
	p := plan(b, `
stage "f" {
  kind   = "filter"
  input  = topic.in
  output = topic.a
  where  = msg.amount > 100 && msg.country == "DE"
}
`+sinkA)
	proc := processor(b, p, "f")
	payload := []byte(`{"order_id":"o-1","customer_id":"c-42","amount":150.5,"country":"DE","items":[{"sku":"a","qty":1}]}`)
	out := make([]Output, 0, 1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m := NewMessage("c-42", payload, nil)
		out, _ = proc.Process(context.Background(), &m, out[:0])
	}
}

func BenchmarkIdentityMap(b *testing.B) {
	p := plan(b, `
stage "m" {
  kind   = "map"
  input  = topic.in
  output = topic.a
}
`+sinkA)
	proc := processor(b, p, "m")
	payload := []byte(`{"order_id":"o-1","customer_id":"c-42","amount":150.5,"country":"DE"}`)
	out := make([]Output, 0, 1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m := NewMessage("c-42", payload, nil)
		out, _ = proc.Process(context.Background(), &m, out[:0])
	}
}

// TestPassedOnSharesDecodedFieldsOnlyOfTheSamePayload: a fused chain's next stage reuses the
// fields a filter decoded, and decodes afresh what a stage changed or made.
func TestPassedOnSharesDecodedFieldsOnlyOfTheSamePayload(t *testing.T) {
	payload := []byte(`{"a":1}`)
	from := NewMessage("k", payload, nil)
	if err := from.Decode(); err != nil {
		t.Fatal(err)
	}
	if m := PassedOn("k", payload, nil, &from); m.Value == nil || fmt.Sprint(m.Value) != fmt.Sprint(from.Value) {
		t.Errorf("the same payload: fields %v, want %v shared", m.Value, from.Value)
	}
	if m := PassedOn("k", []byte(`{"a":1}`), nil, &from); m.Value != nil {
		t.Errorf("another payload of the same bytes shares the fields %v: they may be another message's", m.Value)
	}
	from.Value["a"] = 2
	from.Changed()
	encoded, err := from.Payload()
	if err != nil {
		t.Fatal(err)
	}
	if m := PassedOn("k", encoded, nil, &from); m.Value != nil {
		t.Errorf("a changed message shares its fields %v: the next stage must decode what was written", m.Value)
	}
	undecoded := NewMessage("k", payload, nil)
	if m := PassedOn("k", payload, nil, &undecoded); m.Value != nil {
		t.Errorf("fields %v from a message that never decoded", m.Value)
	}
}

// TestAnEntryMessageDecodesAsAnyOther: an entry's payload, checked as it was read, decodes to the
// same fields without being checked again.
func TestAnEntryMessageDecodesAsAnyOther(t *testing.T) {
	payload := []byte(`{"id":12345678901234567890,"name":"é","items":[{"sku":"a","qty":2}],"ok":true,"none":null}`)
	a, b := NewMessage("k", payload, nil), NewEntryMessage("k", payload, nil)
	if err := a.Decode(); err != nil {
		t.Fatal(err)
	}
	if err := b.Decode(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%#v", a.Value) != fmt.Sprintf("%#v", b.Value) {
		t.Errorf("an entry message decodes to %#v, want %#v", b.Value, a.Value)
	}
	notAnObject := NewEntryMessage("k", []byte(`[1,2]`), nil)
	if err := notAnObject.Decode(); err == nil || !IsPermanent(err) {
		t.Errorf("an entry whose payload is an array decodes with %v, want a permanent error", err)
	}
}

// An attribute whose value is refused (a negative or malformed duration) is reported once, where
// it is written: the kind's own checks, which read it as unset, report nothing more of it.
func TestARefusedValueIsReportedOnce(t *testing.T) {
	aggregateWindow := func(window string) string {
		return `stage "agg" {
  kind      = "aggregate"
  input     = topic.in
  output    = topic.out
  group_by  = msg.k
  window {
    ` + window + `
  }
  aggregate = { n = count() }
}`
	}
	for _, tc := range []struct{ name, block string }{
		{"dedupe within", `stage "once" {
  kind   = "dedupe"
  input  = topic.in
  output = topic.out
  key    = msg.id
  within = "-5m"
}`},
		{"pattern within", `stage "p" {
  kind     = "pattern"
  input    = topic.in
  output   = topic.out
  key      = msg.card
  sequence = [{ name = "a", where = msg.amount < 2 }, { name = "b", where = msg.amount > 500 }]
  within   = "-5m"
  select   = { card = b.card }
}`},
		{"aggregate size", aggregateWindow(`type = "tumbling"` + "\n    size = \"-5m\"")},
		{"aggregate gap", aggregateWindow(`type = "session"` + "\n    gap  = \"soon\"")},
		{"aggregate advance", aggregateWindow(`type = "hopping"` + "\n    size = \"1m\"\n    advance = \"-10s\"")},
		{"rate_limit per", `stage "limit" {
  kind   = "rate_limit"
  input  = topic.in
  output = topic.out
  rate   = 10
  per    = "-1s"
}`},
		{"http sink rate_limit per", `sink "hook" {
  kind  = "http"
  input = topic.out
  url   = "http://localhost:1/"
  rate_limit {
    rate = 10
    per  = "soon"
  }
}`},
	} {
		src := "pipeline \"t\" {}\ntopic \"in\" {}\ntopic \"out\" {}\nsource \"s\" {\n  kind   = \"stdin\"\n  output = topic.in\n}\n" +
			"sink \"out\" {\n  kind  = \"stdout\"\n  input = topic.out\n}\n" + tc.block + "\n"
		cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{})
		}
		diags = errorsOf(diags)
		if len(diags) != 1 || diags[0].Summary != "Invalid duration" || diags[0].Subject == nil {
			t.Errorf("%s: %v, want one error: Invalid duration", tc.name, diags)
			continue
		}
		r := diags[0].Subject
		if got := src[r.Start.Byte:r.End.Byte]; got != `"-5m"` && got != `"soon"` && got != `"-10s"` && got != `"-1s"` {
			t.Errorf("%s: the error is at %q, want the value", tc.name, got)
		}
	}
}

// errorsOf returns the errors among diags, without the warnings.
func errorsOf(diags hcl.Diagnostics) hcl.Diagnostics {
	var out hcl.Diagnostics
	for _, d := range diags {
		if d.Severity == hcl.DiagError {
			out = append(out, d)
		}
	}
	return out
}
