package runtime

import (
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestAnUnchangedMessageKeepsItsKey: a message that goes on unchanged to a topic keyed like the
// one it came from keeps the key it arrived with, without evaluating the key expression again; a
// changed payload, a changed key or another key expression computes it again. (The entry's key is
// set apart from its payload's field here, to tell the two ways apart.)
func TestAnUnchangedMessageKeepsItsKey(t *testing.T) {
	plan := compileSource(t, `
pipeline "p" {}
topic "in" {
  partitions = 4
  key        = msg.k
}
topic "same" {
  partitions = 4
  key        = msg.k
}
topic "other" {
  partitions = 4
  key        = msg.j
}
stage "a" {
  kind   = "filter"
  input  = topic.in
  output = topic.same
  where  = true
}
sink "s" {
  kind  = "stdout"
  input = topic.same
}
sink "o" {
  kind  = "stdout"
  input = topic.other
}
`)
	r := &processing{keys: redis.Keys{Prefix: "p"}, streams: map[string][]string{}}
	n := &node{name: "a", input: plan.Topic("in")}
	payload := []byte(`{"k":"from-payload","j":"other-key"}`)
	read := func() *message {
		return &message{id: "1-0", inKey: "as-read", inPayload: payload, msg: stages.NewMessage("as-read", payload, nil)}
	}
	for _, c := range []struct {
		name   string
		topic  string
		change func(m *stages.Message)
		want   string
	}{
		{"unchanged, same key expression", "same", func(*stages.Message) {}, "as-read"},
		{"decoded but unchanged", "same", func(m *stages.Message) { _ = m.Decode() }, "as-read"},
		{"payload changed", "same", func(m *stages.Message) { _ = m.Decode(); m.Value["x"] = 1; m.Changed() }, "from-payload"},
		{"key changed", "same", func(m *stages.Message) { m.Key = "mine" }, "from-payload"},
		{"another key expression", "other", func(*stages.Message) {}, "other-key"},
	} {
		m := read()
		c.change(&m.msg)
		out, err := r.topicOutput(n, m, plan.Topic(c.topic), &m.msg, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if out.Entry.Key != c.want {
			t.Errorf("%s: key %q, want %q", c.name, out.Entry.Key, c.want)
		}
		if want := r.keys.Stream(c.topic, redis.Partition(c.want, 4)); out.Stream != want {
			t.Errorf("%s: stream %s, want %s", c.name, out.Stream, want)
		}
	}
}

// TestAFieldKeyIsTheKeyExpressionsValue: a topic keyed by a field (key = msg.k) takes a string or a
// plain integer as its key without evaluating the expression (plainKey); whatever it takes so is
// what the expression makes of the field, and whatever else the expression converts or refuses.
func TestAFieldKeyIsTheKeyExpressionsValue(t *testing.T) {
	topic := func(key string) *flow.Topic {
		return compileSource(t, `
pipeline "p" {}
topic "in" {
  partitions = 4
  key        = `+key+`
}
sink "s" {
  kind  = "stdout"
  input = topic.in
}
`).Topic("in")
	}
	in := topic("msg.k")
	if name, ok := in.Key.Field(); !ok || name != "k" {
		t.Fatalf("msg.k: Field() = %q, %v", name, ok)
	}
	for _, key := range []string{`msg.k.a`, `"${msg.k}-"`, `upper(msg.k)`, `msg["k"]`, `msg`} {
		if name, ok := topic(key).Key.Field(); ok {
			t.Errorf("%s: Field() = %q, true", key, name)
		}
	}
	plain := 0
	for _, v := range []string{
		`"abc"`, `""`, `"caf\u00e9"`, `"a\"b"`, `0`, `-0`, `7`, `-7`, `007`, `1002`, `-1002`,
		`123456789012345`, `1234567890123456`, `-123456789012345`, `12345678901234567890`,
		`1.0`, `1.5`, `1e3`, `1E3`, `-0.0`, `100000000000000000000`, `0.1`, `true`, `null`,
		`[1]`, `{"a":1}`,
	} {
		payload := []byte(`{"j":1,"k":` + v + `}`)
		m := stages.NewEntryMessage("", payload, nil)
		fields, lent, err := m.BorrowFields([]string{"k"}, false)
		if err != nil {
			t.Fatal(v, err)
		}
		want, wantErr := in.Key.EvalString(&expr.Env{Msg: fields})
		got, ok := stages.PlainKey(fields["k"])
		stages.ReturnFields(lent)
		if ok {
			plain++
			if wantErr != nil || got != want {
				t.Errorf("PlainKey(%s) = %q; the expression makes %q (%v)", v, got, want, wantErr)
			}
		}
		m = stages.NewEntryMessage("", payload, nil)
		routed, _, err := route(in, &m, 0)
		if (err == nil) != (wantErr == nil) || routed != want {
			t.Errorf("key of %s: routed as %q (%v); the expression makes %q (%v)", v, routed, err, want, wantErr)
		}
	}
	if plain != 11 {
		t.Errorf("%d values taken plain; want 11: the strings and the plain integers", plain)
	}
	// Read from the payload as it came (Message.PlainField), the key is the one decoding finds:
	// the last of a name given twice, a name written with escapes included.
	for payload, want := range map[string]string{
		`{"k":"a","k":"b"}`:            "b",
		`{"\u006b":"x"}`:               "x",
		`{"k":"a","\u006b":"b"}`:       "b",
		`{"k":7,"j":{"k":"inner"}}`:    "7",
		`{"j":"k","k":"a\"b","z":[1]}`: `a"b`,
	} {
		m := stages.NewEntryMessage("", []byte(payload), nil)
		if routed, _, err := route(in, &m, 0); err != nil || routed != want {
			t.Errorf("key of %s: routed as %q (%v), want %q", payload, routed, err, want)
		}
	}
}
