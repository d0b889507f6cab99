package web_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
)

// still is a pipeline that does nothing: the handler needs no runtime, only what Pipeline gives.
type still struct {
	plan  *flow.Plan
	ready error
}

func (s still) Plan() *flow.Plan           { return s.plan }
func (s still) Snapshot() runtime.Snapshot { return runtime.Snapshot{} }
func (s still) Ready() error               { return s.ready }

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Result(), string(body)
}

// TestHandlerWithoutARuntime serves an example's graph, laid out from flow's graph view, and the
// page, from a Pipeline that is not a runtime.
func TestHandlerWithoutARuntime(t *testing.T) {
	plan, _, diags := flow.Build(filepath.Join("..", "..", "examples", "pipelines", "orders"), flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	h := web.NewHandler(still{plan: plan, ready: errors.New("no leases yet")}, nil)
	if res, body := get(t, h, "/healthz"); res.StatusCode != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", res.StatusCode, body)
	}
	if res, body := get(t, h, "/readyz"); res.StatusCode != http.StatusServiceUnavailable || body != "not ready: no leases yet\n" {
		t.Errorf("/readyz: %d %q", res.StatusCode, body)
	}
	if res, _ := get(t, h, "/metrics"); res.StatusCode != http.StatusNotFound {
		t.Errorf("/metrics without a metrics handler: %d", res.StatusCode)
	}

	res, body := get(t, h, "/api/graph")
	var g struct {
		Ready bool `json:"ready"`
		Nodes []struct {
			ID, Detail    string
			Width, Height int
		} `json:"nodes"`
		Edges []struct {
			From, To string
			Points   [][2]int `json:"points"`
		} `json:"edges"`
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/api/graph: %d %v\n%s", res.StatusCode, err, body)
	}
	view := plan.Graph()
	if g.Ready || len(g.Nodes) != len(view.Nodes) || len(g.Edges) != len(view.Edges) {
		t.Fatalf("/api/graph has %d nodes and %d edges (ready %v), the graph view %d and %d",
			len(g.Nodes), len(g.Edges), g.Ready, len(view.Nodes), len(view.Edges))
	}
	for i, n := range view.Nodes {
		if got := g.Nodes[i]; got.ID != n.ID || got.Detail != n.Detail || got.Width == 0 || got.Height == 0 {
			t.Errorf("node %d: %+v, want %s (%s) with a box", i, got, n.ID, n.Detail)
		}
	}
	for i, e := range view.Edges {
		if got := g.Edges[i]; got.From != e.From || got.To != e.To || len(got.Points) < 2 {
			t.Errorf("edge %d: %+v, want %s -> %s with a line", i, got, e.From, e.To)
		}
	}

	res, body = get(t, h, "/")
	if res.StatusCode != http.StatusOK || !strings.Contains(body, "<html") ||
		!strings.Contains(res.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("/: %d %v\n%.200s", res.StatusCode, res.Header, body)
	}
}

// counting is a pipeline that shows the same counters at every request.
type counting struct {
	plan  *flow.Plan
	nodes []runtime.NodeSummary
}

func (c counting) Plan() *flow.Plan           { return c.plan }
func (c counting) Snapshot() runtime.Snapshot { return runtime.Snapshot{Nodes: c.nodes} }
func (c counting) Ready() error               { return nil }

// TestStatefulStagesShowWhatTheyFound serves the revenue example's graph: its stateful stages (a
// dedupe and an aggregate) are marked, in a box a line taller, and their counters include the
// messages found late or repeated and those dropped; other nodes have no such counters.
func TestStatefulStagesShowWhatTheyFound(t *testing.T) {
	plan, _, diags := flow.Build(filepath.Join("..", "..", "examples", "pipelines", "revenue"), flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	h := web.NewHandler(counting{plan: plan, nodes: []runtime.NodeSummary{
		{Name: "orders_once", Type: "stage", Kind: "dedupe", In: 10, Out: 7, Filtered: 3, Duplicates: 3, Dropped: 3},
		{Name: "revenue_per_minute", Type: "stage", Kind: "aggregate", In: 7, Out: 2, Late: 1},
		{Name: "revenue", Type: "sink", Kind: "file", In: 2, Out: 2},
	}}, nil)
	_, body := get(t, h, "/api/graph")
	var g struct {
		Nodes []struct {
			ID       string
			Stateful bool
			Height   int
			Counters map[string]int64
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		t.Fatalf("/api/graph: %v\n%s", err, body)
	}
	nodes := map[string]int{}
	for i, n := range g.Nodes {
		nodes[n.ID] = i
	}
	sink := g.Nodes[nodes["sink.revenue"]]
	for id, want := range map[string]map[string]int64{
		"stage.orders_once":        {"in": 10, "filtered": 3, "late": 0, "duplicates": 3, "dropped": 3},
		"stage.revenue_per_minute": {"in": 7, "filtered": 0, "late": 1, "duplicates": 0, "dropped": 0},
	} {
		n := g.Nodes[nodes[id]]
		if !n.Stateful || n.Height <= sink.Height {
			t.Errorf("%s: stateful %v, height %d (a sink's is %d); want a stateful stage in a taller box", id, n.Stateful, n.Height, sink.Height)
		}
		for k, v := range want {
			if got, ok := n.Counters[k]; !ok || got != v {
				t.Errorf("%s: counter %s is %d (present %v), want %d", id, k, got, ok, v)
			}
		}
	}
	if _, ok := sink.Counters["late"]; sink.Stateful || ok {
		t.Errorf("the sink shows counters of a stateful stage: %+v", sink)
	}

	// A repartition stage keeps a watermark, but finds nothing late: it is not shown as stateful.
	plan, _, diags = flow.Build(filepath.Join("..", "flowtest", "testdata", "repartition"), flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	_, body = get(t, web.NewHandler(still{plan: plan}, nil), "/api/graph")
	g.Nodes = nil
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		t.Fatal(err)
	}
	for _, n := range g.Nodes {
		if want := n.ID == "stage.per_customer"; n.Stateful != want {
			t.Errorf("%s: stateful %v, want %v", n.ID, n.Stateful, want)
		}
	}
}
