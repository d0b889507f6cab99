package flow_test

import (
	"strings"
	"testing"

	. "github.com/flowrun/flowrun/flow"
)

// definitionsPipeline is a pipeline whose parts the tests below change one at a time.
const definitionsPipeline = `
pipeline "defs" {}
variable "limit" { default = 10 }
locals { label = "big" }
topic "in" {
  partitions = 2
  key        = msg.customer
}
topic "counts" {}
retry "patient" { max_attempts = 5 }
source "gen" {
  kind   = "generate"
  count  = 10
  template = { customer = "c1", amount = 5 }
  output = topic.in
}
stage "big" {
  kind  = "filter"
  input = topic.in
  where = msg.amount > var.limit
  retry = retry.patient
}
stage "tag" {
  kind  = "map"
  input = stage.big
  set   = { label = local.label }
}
stage "count" {
  kind     = "aggregate"
  input    = topic.in
  output   = topic.counts
  group_by = msg.customer
  grace    = "1s"
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.tag
}
sink "totals" {
  kind  = "stdout"
  input = topic.counts
}
`

// TestDefinitionsChangeWithWhatTheyRead checks which nodes' definitions and state shapes change
// with each kind of edit: a node's own attributes, the variables, locals, topics and retry policies
// it reads, and nothing for an edit of layout or comments.
func TestDefinitionsChangeWithWhatTheyRead(t *testing.T) {
	base := compileSource(t, definitionsPipeline, Options{})
	for _, addr := range []string{"source.gen", "stage.big", "stage.tag", "stage.count", "sink.out", "sink.totals"} {
		if base.Definitions[addr] == "" {
			t.Fatalf("no definition of %s: %v", addr, base.Definitions)
		}
	}
	// The shape is recorded in Redis: its rendering must not change between versions, or every
	// stateful stage would be refused after an upgrade.
	want := "kind = aggregate\ngroup_by = msg.customer\naggregate = { n = count() }\n{ window; size = \"1m\"; type = \"tumbling\" }"
	if len(base.StateShapes) != 1 || base.StateShapes["count"] != want || StateFingerprint(want) != "b7b4754d5f107a02" {
		t.Fatalf("state shapes: %q (fingerprint %s), want %q", base.StateShapes, StateFingerprint(base.StateShapes["count"]), want)
	}
	cases := []struct {
		name         string
		old, new     string
		opts         Options
		changed      []string // the node addresses whose definitions change
		shapeChanged bool     // whether the aggregate's state fingerprint changes
	}{
		{name: "layout and comments", old: "where = msg.amount > var.limit", new: "where = msg.amount  >  var.limit # big ones\n"},
		{name: "a filter", old: "msg.amount > var.limit", new: "msg.amount >= var.limit", changed: []string{"stage.big"}},
		{name: "a variable", opts: Options{Vars: []string{"limit=20"}}, changed: []string{"stage.big"}},
		{name: "a local", old: `label = "big"`, new: `label = "large"`, changed: []string{"stage.tag"}},
		{name: "a retry policy", old: "max_attempts = 5", new: "max_attempts = 6", changed: []string{"stage.big"}},
		{name: "a topic", old: "partitions = 2", new: "partitions = 3", changed: []string{"source.gen", "stage.big", "stage.count"}},
		{name: "an aggregate's grace", old: `grace    = "1s"`, new: `grace    = "2s"`, changed: []string{"stage.count"}},
		{name: "an aggregate's window", old: `size = "1m"`, new: `size = "2m"`, changed: []string{"stage.count"}, shapeChanged: true},
		{name: "an aggregate's set", old: "n = count()", new: "n = count(), m = count()", changed: []string{"stage.count"}, shapeChanged: true},
		{name: "an aggregate's group", old: "group_by = msg.customer", new: "group_by = msg.amount", changed: []string{"stage.count"}, shapeChanged: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := definitionsPipeline
			if c.old != "" {
				if !strings.Contains(src, c.old) {
					t.Fatalf("%q is not in the pipeline", c.old)
				}
				src = strings.Replace(src, c.old, c.new, 1)
			}
			plan := compileSource(t, src, c.opts)
			var changed []string
			for _, addr := range []string{"source.gen", "stage.big", "stage.tag", "stage.count", "sink.out", "sink.totals"} {
				if plan.Definitions[addr] != base.Definitions[addr] {
					changed = append(changed, addr)
				}
			}
			if strings.Join(changed, " ") != strings.Join(c.changed, " ") {
				t.Errorf("changed %v, want %v", changed, c.changed)
			}
			shapeChanged := StateFingerprint(plan.StateShapes["count"]) != StateFingerprint(base.StateShapes["count"])
			if shapeChanged != c.shapeChanged {
				t.Errorf("state fingerprint changed: %v, want %v\nwas: %s\nnow: %s", shapeChanged, c.shapeChanged,
					base.StateShapes["count"], plan.StateShapes["count"])
			}
		})
	}
}
