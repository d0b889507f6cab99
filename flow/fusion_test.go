package flow_test

import (
	"context"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

func init() {
	pass := func(_ context.Context, m stages.Message) ([]stages.Message, error) { return []stages.Message{m}, nil }
	stages.Register("fusetest.keeps", pass, stages.KeepsKey())
	stages.Register("fusetest.rekeys", pass)
}

// TestWhichStagesFuse compiles small pipelines and checks the chains they make: stateless stages
// chained by stage references fuse, after a stage that keeps its messages' keys (filter, map, a Go
// function registered with stages.KeepsKey); a declared topic, a second reader, state,
// fuse = false, a stricter ordering downstream, another delivery, and a stage that may change
// keys before it keep a stream between them.
func TestWhichStagesFuse(t *testing.T) {
	const head = `
topic "in" {
  partitions = 2
}
stage "a" {
  kind  = "filter"
  input = topic.in
  where = true
}
`
	const sink = `
sink "out" {
  kind  = "stdout"
  input = stage.b
}
`
	for _, c := range []struct {
		name, src string
		want      string // the chains' names, comma-separated
	}{
		{"stage references fuse", head + `
stage "b" {
  kind  = "map"
  input = stage.a
  set   = { x = 1 }
}
stage "c" {
  kind  = "filter"
  input = stage.b
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.c
}
`, "a+b+c"},
		{"a declared topic stays a stream", `
topic "in" {
  partitions = 2
}
topic "mid" {
  partitions = 2
}
stage "a" {
  kind   = "filter"
  input  = topic.in
  output = topic.mid
  where  = true
}
stage "b" {
  kind  = "filter"
  input = topic.mid
  where = true
}
` + sink, ""},
		{"two readers keep the stream", head + `
stage "b" {
  kind  = "filter"
  input = stage.a
  where = true
}
sink "also" {
  kind  = "stdout"
  input = stage.a
}
` + sink, ""},
		{"fuse = false", head + `
stage "b" {
  kind  = "filter"
  input = stage.a
  where = true
  fuse  = false
}
` + sink, ""},
		{"stricter ordering downstream", head + `
stage "b" {
  kind     = "filter"
  input    = stage.a
  where    = true
  ordering = "partition"
}
` + sink, ""},
		{"looser ordering downstream", head + `
stage "b" {
  kind     = "filter"
  input    = stage.a
  where    = true
  ordering = "none"
}
` + sink, "a+b"},
		{"another delivery", head + `
stage "b" {
  kind     = "filter"
  input    = stage.a
  where    = true
  delivery = "effectively_once"
}
` + sink, ""},
		{"after a Go function that keeps keys", head + `
stage "b" {
  kind  = "go"
  input = stage.a
  func  = "fusetest.keeps"
}
stage "c" {
  kind  = "filter"
  input = stage.b
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.c
}
`, "a+b+c"},
		{"after a Go function that may change keys", head + `
stage "b" {
  kind  = "go"
  input = stage.a
  func  = "fusetest.rekeys"
}
stage "c" {
  kind  = "filter"
  input = stage.b
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.c
}
`, "a+b"},
		{"a stateful stage", head + `
stage "b" {
  kind   = "dedupe"
  input  = stage.a
  key    = msg.id
  within = "1m"
}
` + sink, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(`pipeline "p" {}` + c.src)})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			plan, diags := flow.Compile(cfg, flow.Options{GoFuncs: stages.Names()})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			var names []string
			for _, ch := range plan.Chains {
				names = append(names, ch.Name())
			}
			if got := strings.Join(names, ","); got != c.want {
				t.Errorf("chains %q, want %q", got, c.want)
			}
			for _, tp := range plan.Topics {
				if tp.Name == "a.out" && plan.Fused(tp) != (c.want != "") {
					t.Errorf("a.out fused: %v", plan.Fused(tp))
				}
			}
			plan.UnfuseTopics(map[string]bool{"a.out": true})
			for _, ch := range plan.Chains {
				if ch.Head().Name == "a" {
					t.Errorf("a test that names a.out leaves the chain %s", ch.Name())
				}
			}
		})
	}
}
