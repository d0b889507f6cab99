package flow_test

import (
	"slices"
	"testing"

	. "github.com/flowrun/flowrun/flow"
)

// TestAJoinReadsBothSidesThroughOneTopic: the compiler gives a join one repartition topic, as many
// partitions as its widest side's input, written by a repartition stage per side that reads the
// side's input; the join's watermark is the least of theirs, each in its side's event time, and
// the side's inputs are what it reads, not outputs of the join.
func TestAJoinReadsBothSidesThroughOneTopic(t *testing.T) {
	p := compileSource(t, `
pipeline "j" {}
source "v" {
  kind   = "stdin"
  output = topic.views
}
source "c" {
  kind   = "stdin"
  output = topic.clicks
}
topic "views" {
  partitions = 3
  key        = msg.view_id
}
topic "clicks" {
  partitions = 5
}
stage "clicked" {
  kind = "join"
  left {
    input      = topic.views
    key        = msg.ad_id
    event_time = msg.viewed_at
  }
  right {
    input      = topic.clicks
    key        = msg.ad
    event_time = msg.ts
  }
  after = "10m"
}
sink "out" {
  kind  = "stdout"
  input = stage.clicked
}
`, Options{})
	j := p.Stage("clicked")
	if j.Input == nil || j.Input.Name != "clicked.by_key" || j.Input.Partitions != 5 || j.Input.Key != nil {
		t.Fatalf("the join reads %+v; want clicked.by_key, 5 partitions, keyed by each message's key", j.Input)
	}
	if out := p.Topic("clicked.out"); out == nil || out.Partitions != 5 {
		t.Fatalf("the join's own output %+v; want 5 partitions, like what it reads", out)
	}
	for side, input := range map[string]string{"left": "views", "right": "clicks"} {
		s := p.Stage("clicked." + side)
		if s == nil || s.Kind != RepartitionKind || s.Side != side || s.Input.Name != input || s.Output != j.Input {
			t.Fatalf("the %s side's stage is %+v", side, s)
		}
	}
	if got := j.Outputs(); len(got) != 1 || got[0].Name != "clicked.out" {
		t.Fatalf("the join writes %v; want its output only (its sides' inputs are read)", got)
	}
	if got := writersOf(t, p, "clicked.by_key"); !slices.Equal(got, []string{"stage.clicked.left (results)", "stage.clicked.right (results)"}) {
		t.Fatalf("the writers of the join's topic: %v", got)
	}
	if got := domainsOf(p.Topic("clicked.by_key").Watermark.Domains); !slices.Equal(got, []string{""}) {
		t.Fatalf("the join reads its topic by %q, want the tagged time only", got)
	}
	if got := domainsOf(p.Topic("views").Watermark.Domains); !slices.Equal(got, []string{"msg.viewed_at"}) {
		t.Fatalf("the left side reads its input by %q, want its event_time", got)
	}
	if got := domainsOf(p.Topic("clicks").Watermark.Domains); !slices.Equal(got, []string{"msg.ts"}) {
		t.Fatalf("the right side reads its input by %q, want its event_time", got)
	}
	if w := p.Stage("clicked.right").Watermark; w == nil || w.Own < 0 || w.Domains[w.Own].Name != "msg.ts" {
		t.Fatalf("the right side keeps %+v; want its own time, msg.ts", w)
	}
}
