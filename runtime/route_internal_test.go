package runtime

import (
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestAnUnchangedMessageKeepsItsKey: a message that goes on unchanged to a topic keyed like the
// one it came from keeps the key it arrived with, without evaluating the key expression again; a
// changed payload, a changed key or another key expression computes it again. (The entry's key is
// set apart from its payload's field here, to tell the two ways apart.)
func TestAnUnchangedMessageKeepsItsKey(t *testing.T) {
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(`
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
`)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
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
