package flow_test

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/flowrun/flowrun/flow"
)

// tablePipeline is a lookup of orders against a customers table, whose topic has the given
// partitions and key, and the table the given key attribute.
func tablePipeline(partitions int, topicKey, tableKey string) string {
	return fmt.Sprintf(`
pipeline "p" {}
topic "customers" {
  partitions = %d
  %s
}
topic "orders" {
  partitions = 3
  key        = msg.order_id
}
table "customers" {
  input = topic.customers
  %s
}
stage "enriched" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
  missing = "dead_letter"
}
sink "out" {
  kind  = "stdout"
  input = stage.enriched
}
`, partitions, topicKey, tableKey)
}

// TestTableCompiles checks what a table becomes: a stateful stage of TableKind that reads the
// table's topic, writes nothing, comes before its lookups, and whose state is keyed by the table's
// key, with a repartition topic where the topic is keyed otherwise.
func TestTableCompiles(t *testing.T) {
	for _, tc := range []struct {
		name                string
		partitions          int
		topicKey, tableKey  string
		repartition, keyset bool
	}{
		{"keyed like its topic by default", 4, "key = msg.customer_id", "", false, false},
		{"the same key as its topic", 4, "key = msg.customer_id", "key = msg . customer_id", false, true},
		{"another key than its topic", 4, "key = msg.region", "key = msg.customer_id", true, true},
		{"a topic without a key", 4, "", "key = msg.customer_id", true, true},
		{"one partition holds every key", 1, "key = msg.region", "key = msg.customer_id", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := compileSource(t, tablePipeline(tc.partitions, tc.topicKey, tc.tableKey), Options{})
			table := plan.Table("customers")
			if table == nil || len(plan.Tables) != 1 {
				t.Fatalf("tables %v", plan.Tables)
			}
			s := table.Stage
			switch {
			case s == nil || plan.Stage("customers.table") != s:
				t.Fatalf("the table's stage is customers.table: %+v", s)
			case s.Kind != TableKind || s.Output != nil || len(s.Outputs()) != 0 || s.Spec == nil || !s.Spec.Stateful(s.Config):
				t.Fatalf("table stage %+v", s)
			case (table.Key != nil) != tc.keyset || table.Input != plan.Topic("customers"):
				t.Fatalf("table %+v", table)
			case plan.TableOf(s) != table:
				t.Fatalf("TableOf(%s) = %v", s.Name, plan.TableOf(s))
			}
			lookup := plan.Stage("enriched")
			if got := lookup.Tables(); len(got) != 1 || got[0] != table {
				t.Fatalf("the lookup's tables: %v", got)
			}
			if lookup.Input.Name != "orders" {
				t.Fatalf("a lookup needs no repartition: it reads %s", lookup.Input.Name)
			}
			position := map[string]int{}
			for i, st := range plan.Stages {
				position[st.Name] = i
			}
			if position["customers.table"] > position["enriched"] {
				t.Fatalf("the table's stage comes after its lookup: %v", position)
			}
			if got := s.Input.Name == "customers.table.by_key"; got != tc.repartition {
				t.Fatalf("the table's stage reads %s; want a repartition topic: %v", s.Input.Name, tc.repartition)
			}
			if tc.repartition {
				r := plan.Stage("customers.table.by_key")
				if r == nil || r.Kind != RepartitionKind || r.Input != table.Input || s.Input.Repartition != r ||
					s.Input.Key.String() != table.Key.String() || s.Input.Partitions != tc.partitions {
					t.Fatalf("repartition stage %+v, topic %+v", r, s.Input)
				}
			}
			// A stage with no output: its input's watermark follows its writers, and it passes none on.
			if s.Watermark == nil || s.Watermark.Own < 0 {
				t.Fatalf("the table's stage keeps no watermark: %+v", s.Watermark)
			}
			var graph strings.Builder
			if err := WriteGraph(&graph, plan, "dot"); err != nil {
				t.Fatal(err)
			}
			if want := `"stage.customers.table" -> "stage.enriched" [style=dotted, label="lookup"];`; !strings.Contains(graph.String(), want) {
				t.Fatalf("the graph has no lookup edge %s:\n%s", want, graph.String())
			}
			desc := plan.Describe()
			var found bool
			for _, st := range desc["stages"].([]any) {
				d := st.(map[string]any)
				if d["name"] == "enriched" {
					found = d["config"].(map[string]any)["table"] == "customers"
				}
			}
			if !found {
				t.Fatalf("Describe does not name the lookup's table: %v", desc["stages"])
			}
		})
	}
}

// TestUnusedTableWarns checks that a table no lookup reads is reported, and still compiled.
func TestUnusedTableWarns(t *testing.T) {
	src := `
pipeline "p" {}
topic "customers" {
  partitions = 2
  key        = msg.customer_id
}
source "in" {
  kind   = "stdin"
  output = topic.customers
}
table "customers" {
  input = topic.customers
}
`
	plan, diags := compileDiags(t, src, Options{})
	if diags.HasErrors() || len(diags) != 1 || diags[0].Summary != "Unused table" {
		t.Fatalf("diagnostics: %v", diags)
	}
	if plan.Stage("customers.table") == nil {
		t.Fatal("an unused table is not kept")
	}
}

// TestTableNamesDoNotCollide checks that a table may share its name with a topic and a stage:
// tables have a namespace of their own, and their stages a name no block can have.
func TestTableNamesDoNotCollide(t *testing.T) {
	src := `
pipeline "p" {}
topic "customers" {
  partitions = 2
  key        = msg.customer_id
}
table "customers" {
  input = topic.customers
}
stage "customers" {
  kind  = "lookup"
  input = topic.customers
  table = table.customers
  key   = msg.customer_id
  as    = "again"
}
sink "out" {
  kind  = "stdout"
  input = stage.customers
}
`
	plan := compileSource(t, src, Options{})
	if plan.Stage("customers") == nil || plan.Stage("customers.table") == nil {
		t.Fatalf("stages %v", plan.Stages)
	}
}
