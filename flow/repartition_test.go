package flow_test

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/flowrun/flowrun/flow"
)

// TestRepartitionTopics checks when the compiler inserts a repartition topic before a stateful
// stage: only where the input has several partitions and is keyed by something else than the
// stage's state.
func TestRepartitionTopics(t *testing.T) {
	pipeline := func(partitions int, topicKey, stage string) string {
		return fmt.Sprintf(`
pipeline "p" {}
topic "orders" {
  partitions = %d
  %s
}
%s
sink "out" {
  kind  = "stdout"
  input = stage.s
}
`, partitions, topicKey, stage)
	}
	aggregate := func(groupBy string) string {
		return `stage "s" {
  kind  = "aggregate"
  input = topic.orders
  ` + groupBy + `
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}`
	}
	dedupe := `stage "s" {
  kind   = "dedupe"
  input  = topic.orders
  key    = msg.order_id
  within = "1h"
}`
	for _, tc := range []struct {
		name, src   string
		repartition bool
	}{
		{"group_by differs from the topic's key", pipeline(4, "key = msg.region", aggregate("group_by = msg.customer")), true},
		{"group_by on a topic without a key", pipeline(4, "", aggregate("group_by = msg.customer")), true},
		{"group_by is the topic's key", pipeline(4, "key = msg.customer", aggregate("group_by = msg . customer")), false},
		{"one partition holds every key", pipeline(1, "key = msg.region", aggregate("group_by = msg.customer")), false},
		{"dedupe key differs from the topic's key", pipeline(4, "key = msg.customer", dedupe), true},
		{"dedupe key is the topic's key", pipeline(4, "key = msg.order_id", dedupe), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := compileSource(t, tc.src, Options{})
			s := plan.Stage("s")
			if got := s.Input.Name == "s.by_key"; got != tc.repartition {
				t.Fatalf("stage s reads %s; want a repartition topic: %v", s.Input.Name, tc.repartition)
			}
			if !tc.repartition {
				if len(plan.Stages) != 1 {
					t.Fatalf("stages %d, want 1", len(plan.Stages))
				}
				return
			}
			r := plan.Stage("s.by_key")
			switch {
			case r == nil || plan.Stages[0] != r:
				t.Fatalf("the repartition stage s.by_key comes first: %v", plan.Stages)
			case r.Kind != RepartitionKind || r.Input.Name != "orders" || r.Output != s.Input || r.Repartitions != s:
				t.Fatalf("repartition stage %+v", r)
			case s.Input.Partitions != 4 || s.Input.Repartition != r || s.Input.Key.String() != s.Config.Expr(s.Spec.StateKey).String():
				t.Fatalf("repartition topic %+v", s.Input)
			}
			var graph strings.Builder
			if err := WriteGraph(&graph, plan, "mermaid"); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(graph.String(), `topic_s_by_key[("s.by_key<br/>4 partitions<br/>key: `) {
				t.Errorf("the graph does not show the repartition topic:\n%s", graph.String())
			}
		})
	}
}
