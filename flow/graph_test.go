package flow_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
)

// routesPipeline has a dedupe whose duplicates, an aggregate whose late events, and a stage and a
// sink whose dead letters go to topics, each read by a sink.
const routesPipeline = "testdata/routes"

// TestGraphsDrawEveryRoute renders the routes of messages besides a stage's output as edges from
// the stage to the topic, told apart from outputs and from each other: the late and duplicates
// routes dashed, labelled with their attribute, the dead letters dashed in another colour. Each
// such topic then has its reader's edge, as any topic does.
func TestGraphsDrawEveryRoute(t *testing.T) {
	plan, _, diags := flow.Build(routesPipeline, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	render := func(format string) string {
		var b bytes.Buffer
		if err := flow.WriteGraph(&b, plan, format); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}

	dot := render("dot")
	for _, want := range []string{
		`"stage.per_minute" -> "topic.late_clicks" [style=dashed, color="#7d3c98", fontcolor="#7d3c98", label="late"];`,
		`"stage.once" -> "topic.duplicate_clicks" [style=dashed, color="#7d3c98", fontcolor="#7d3c98", label="duplicates"];`,
		`"stage.once" -> "topic.failed" [style=dashed, color="#c0392b", fontcolor="#c0392b", label="dead letters"];`,
		`"sink.counts" -> "topic.failed" [style=dashed, color="#c0392b", fontcolor="#c0392b", label="dead letters"];`,
		`"stage.per_minute" -> "topic.per_minute";`, // its output, drawn as before
		`"topic.late_clicks" -> "sink.late";`,
		`"topic.duplicate_clicks" -> "sink.duplicates";`,
		`"topic.failed" -> "sink.failures";`,
	} {
		if !strings.Contains(dot, "\n  "+want+"\n") {
			t.Errorf("the DOT graph lacks %s:\n%s", want, dot)
		}
	}

	// Mermaid draws the routes dotted and colours them with linkStyle, which names links by their
	// position among the chart's links.
	mermaid := render("mermaid")
	var links []string
	styles := map[string]string{} // link -> its linkStyle
	for _, line := range strings.Split(mermaid, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "linkStyle "):
			f := strings.Fields(line)
			for _, i := range strings.Split(f[1], ",") {
				n, err := strconv.Atoi(i)
				if err != nil || n >= len(links) {
					t.Fatalf("linkStyle names link %q of %d: %s", i, len(links), line)
				}
				styles[links[n]] = f[2]
			}
		case strings.Contains(line, "-->") || strings.Contains(line, ".->"):
			links = append(links, line)
		}
	}
	for link, style := range map[string]string{
		"stage_per_minute -. late .-> topic_late_clicks":      "stroke:#7d3c98,color:#7d3c98",
		"stage_once -. duplicates .-> topic_duplicate_clicks": "stroke:#7d3c98,color:#7d3c98",
		"stage_once -. dead letters .-> topic_failed":         "stroke:#c0392b,color:#c0392b",
		"sink_counts -. dead letters .-> topic_failed":        "stroke:#c0392b,color:#c0392b",
		"stage_per_minute --> topic_per_minute":               "",
		"topic_late_clicks --> sink_late":                     "",
		"topic_duplicate_clicks --> sink_duplicates":          "",
		"topic_failed --> sink_failures":                      "",
		"stage_once --> stage_per_minute":                     "",
		"topic_clicks --> stage_once":                         "",
		"topic_per_minute --> sink_counts":                    "",
	} {
		found := false
		for _, l := range links {
			found = found || l == link
		}
		if !found {
			t.Errorf("the Mermaid chart lacks the link %s:\n%s", link, mermaid)
		} else if styles[link] != style {
			t.Errorf("the Mermaid link %s is styled %q, want %q", link, styles[link], style)
		}
	}
	if len(links) != 11 {
		t.Errorf("the Mermaid chart has %d links, want 11:\n%s", len(links), mermaid)
	}

	var doc struct {
		Edges []struct{ From, To, Kind, Label string } `json:"edges"`
	}
	if err := json.Unmarshal([]byte(render("json")), &doc); err != nil {
		t.Fatal(err)
	}
	edges := map[string]string{} // from>to -> kind/label
	for _, e := range doc.Edges {
		edges[e.From+">"+e.To] = e.Kind + "/" + e.Label
	}
	for edge, want := range map[string]string{
		"stage.per_minute>topic.late_clicks":     "side_output/late",
		"stage.once>topic.duplicate_clicks":      "side_output/duplicates",
		"stage.once>topic.failed":                "dead_letter/",
		"sink.counts>topic.failed":               "dead_letter/",
		"stage.per_minute>topic.per_minute":      "writes/",
		"topic.late_clicks>sink.late":            "reads/",
		"topic.duplicate_clicks>sink.duplicates": "reads/",
	} {
		if got := edges[edge]; got != want {
			t.Errorf("the JSON graph's edge %s is %q, want %q", edge, got, want)
		}
	}

	// A side output is one of what the stage writes, as its output is; its dead letters are not.
	for _, e := range plan.Edges {
		if want := e.Kind == flow.EdgeWrites || e.Kind == flow.EdgeSideOutput; e.Writes() != want {
			t.Errorf("%s -> %s (%s): Writes() is %v", e.From, e.To, e.Kind, e.Writes())
		}
	}
	var outputs []string
	for _, o := range plan.Stage("per_minute").Outputs() {
		outputs = append(outputs, o.Name)
	}
	if got := strings.Join(outputs, " "); got != "per_minute late_clicks" {
		t.Errorf("per_minute's outputs are %s", got)
	}
}

// TestARepartitionStageHasNoSideOutputs: the repartition stage inserted before an aggregate shares
// the aggregate's configuration, but only the aggregate routes late events.
func TestARepartitionStageHasNoSideOutputs(t *testing.T) {
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(`
pipeline "p" {}
topic "in" {
  partitions = 2
}
topic "late" {
  partitions = 1
}
stage "agg" {
  kind     = "aggregate"
  input    = topic.in
  group_by = msg.user
  window {
    type = "tumbling"
    size = "1m"
  }
  late      = topic.late
  aggregate = { n = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.agg
}
sink "late" {
  kind  = "stdout"
  input = topic.late
}
`)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	var side []string
	for _, e := range plan.Edges {
		if e.Kind == flow.EdgeSideOutput {
			side = append(side, e.From+">"+e.To+"/"+e.Label)
		}
	}
	if got := strings.Join(side, " "); got != "stage.agg>topic.late/late" {
		t.Errorf("side outputs %s, want only the aggregate's late route", got)
	}
	if r := plan.Stage("agg.by_key"); r == nil || len(r.Outputs()) != 1 || len(r.SideOutputs()) != 0 {
		t.Errorf("the repartition stage writes %v", r.Outputs())
	}
}
