package runtime

import (
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

const diffPipeline = `
pipeline "diff" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  output   = topic.in
  template = { k = "a", n = index }
}
stage "tag" {
  kind  = "map"
  input = topic.in
  set   = { v = 1 }
}
stage "keep" {
  kind  = "filter"
  input = stage.tag
  where = msg.n > 0
}
sink "out" {
  kind  = "stdout"
  input = stage.keep
}
sink "all" {
  kind  = "stdout"
  input = topic.in
}
`

// compileSource compiles a pipeline from its source, with the Go functions the stages package
// registers, failing the test on any error.
func compileSource(t *testing.T, src string) *flow.Plan {
	t.Helper()
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(src)})
	plan, more := flow.Compile(cfg, flow.Options{GoFuncs: stages.Names(), LookupEnv: func(string) (string, bool) { return "", false }})
	if diags = append(diags, more...); diags.HasErrors() {
		t.Fatal(diags)
	}
	return plan
}

// TestDiffPlans: which nodes a reload restarts, starts and stops, and what it refuses.
func TestDiffPlans(t *testing.T) {
	cases := []struct {
		name, old, new                    string
		opts                              Options
		changed, added, removed, problems string
	}{
		{name: "nothing"},
		// keep runs fused after tag: the chain restarts as a whole.
		{name: "a filter in a chain", old: "msg.n > 0", new: "msg.n > 1", changed: "stage.tag stage.keep"},
		{name: "the same without fusion", old: "msg.n > 0", new: "msg.n > 1", opts: Options{NoFusion: true}, changed: "stage.keep"},
		{name: "a sink", old: "input = topic.in\n}\n", new: "input = topic.in\n  where = msg.n > 5\n}\n", changed: "sink.all"},
		{name: "a removed sink", old: "sink \"all\" {\n  kind  = \"stdout\"\n  input = topic.in\n}\n", new: "", removed: "sink.all"},
		{name: "an added stage", old: "sink \"all\"", new: "stage \"more\" {\n  kind = \"map\"\n  input = topic.in\n  set = { w = 2 }\n}\nsink \"more_out\" {\n  kind = \"stdout\"\n  input = stage.more\n}\nsink \"all\"",
			added: "stage.more sink.more_out"},
		{name: "a topic's partitions", old: "partitions = 2", new: "partitions = 3", changed: "source.gen stage.tag stage.keep sink.out sink.all",
			problems: "topic in (p.hcl:3,1-11) changed (partitions 2, now 3)"},
		{name: "a source", old: `k = "a"`, new: `k = "b"`, changed: "source.gen", problems: "source.gen changed"},
		{name: "the key prefix", old: `pipeline "diff" {}`, new: `pipeline "diff" { key_prefix = "other" }`, problems: "key_prefix changed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			was, next := compileSource(t, diffPipeline), compileSource(t, strings.Replace(diffPipeline, c.old, c.new, 1))
			if c.opts.NoFusion {
				was.Unfuse()
				next.Unfuse()
			}
			d := diffPlans(was, next, c.opts)
			if got := strings.Join(d.changed, " "); got != c.changed {
				t.Errorf("changed %q, want %q", got, c.changed)
			}
			if got := strings.Join(d.added, " "); got != c.added {
				t.Errorf("added %q, want %q", got, c.added)
			}
			if got := strings.Join(d.removed, " "); got != c.removed {
				t.Errorf("removed %q, want %q", got, c.removed)
			}
			if got := strings.Join(d.problems, "; "); c.problems == "" && got != "" || !strings.Contains(got, c.problems) {
				t.Errorf("problems %q, want %q", got, c.problems)
			}
		})
	}
}
