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
	"time"

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

// snapshotOf is a pipeline that shows the same snapshot at every request.
type snapshotOf struct {
	plan *flow.Plan
	snap runtime.Snapshot
}

func (s snapshotOf) Plan() *flow.Plan           { return s.plan }
func (s snapshotOf) Snapshot() runtime.Snapshot { return s.snap }
func (s snapshotOf) Ready() error               { return nil }

// TestTheGraphDrawsEveryRoute serves the graph of a dedupe whose duplicates, an aggregate whose
// late events, and a stage and a sink whose dead letters go to topics: each route is an edge of
// its kind from its node to the topic, with the rate of what its node sent there, and the output
// edge of the aggregate has the rate of what it wrote there, its late events not included.
func TestTheGraphDrawsEveryRoute(t *testing.T) {
	plan, _, diags := flow.Build(filepath.Join("..", "..", "flow", "testdata", "routes"), flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	snap := runtime.Snapshot{
		Nodes: []runtime.NodeSummary{
			{Name: "once", Type: "stage", Kind: "dedupe", In: 60, Out: 50, DeadLettered: 10, Duplicates: 20},
			{Name: "per_minute", Type: "stage", Kind: "aggregate", In: 30, Out: 8, Late: 5},
			{Name: "counts", Type: "sink", Kind: "stdout", In: 3, Out: 2, DeadLettered: 1},
			{Name: "late", Type: "sink", Kind: "stdout", In: 5, Out: 5},
			{Name: "duplicates", Type: "sink", Kind: "stdout", In: 20, Out: 20},
			{Name: "failures", Type: "sink", Kind: "stdout", In: 11, Out: 11},
		},
		Rates: runtime.Rates{Since: since, Until: since.Add(5 * time.Second), Nodes: map[string]runtime.NodeRate{
			"once":       {In: 6, Out: 5, DeadLettered: 1, Duplicates: 2},
			"per_minute": {In: 3, Out: 0.8, Late: 0.5},
			"counts":     {In: 0.3, Out: 0.2, DeadLettered: 0.1},
			"late":       {In: 0.5, Out: 0.5},
			"duplicates": {In: 2, Out: 2},
			"failures":   {In: 1.1, Out: 1.1},
		}},
	}
	_, body := get(t, web.NewHandler(snapshotOf{plan: plan, snap: snap}, nil), "/api/graph")
	var g struct {
		Edges []struct {
			From, To, Kind, Label, Topic string
			Rate                         *float64
			Points                       [][2]int
		} `json:"edges"`
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		t.Fatalf("/api/graph: %v\n%s", err, body)
	}
	type want struct {
		kind, label, topic string
		rate               float64
	}
	edges := map[string]want{}
	for _, e := range g.Edges {
		if e.Rate == nil || len(e.Points) < 2 {
			t.Errorf("%s -> %s: rate %v, points %v", e.From, e.To, e.Rate, e.Points)
			continue
		}
		edges[e.From+">"+e.To] = want{e.Kind, e.Label, e.Topic, *e.Rate}
	}
	for edge, w := range map[string]want{
		"stage.once>topic.duplicate_clicks":      {"side_output", "duplicates", "duplicate_clicks", 2},
		"stage.per_minute>topic.late_clicks":     {"side_output", "late", "late_clicks", 0.5},
		"stage.once>topic.failed":                {"dead_letter", "", "failed", 1},
		"sink.counts>topic.failed":               {"dead_letter", "", "failed", 0.1},
		"stage.per_minute>topic.per_minute":      {"writes", "", "per_minute", 0.3}, // 0.8 written, 0.5 of it late
		"stage.once>stage.per_minute":            {"reads", "", "once.out", 3},      // what per_minute read
		"topic.late_clicks>sink.late":            {"reads", "", "late_clicks", 0.5},
		"topic.duplicate_clicks>sink.duplicates": {"reads", "", "duplicate_clicks", 2},
		"topic.failed>sink.failures":             {"reads", "", "failed", 1.1},
	} {
		if got, ok := edges[edge]; !ok || got != w {
			t.Errorf("edge %s: %+v (present %v), want %+v", edge, got, ok, w)
		}
	}
	if len(g.Edges) != len(plan.Graph().Edges) || len(g.Edges) != 11 {
		t.Errorf("/api/graph has %d edges, the graph view %d, want 11", len(g.Edges), len(plan.Graph().Edges))
	}
}

// TestTheGraphShowsWatermarks serves the revenue example's graph with a snapshot in which the dedupe
// has a watermark ahead of the clock and the aggregate none yet: each partition's watermark and lag
// (the time taken less the watermark, negative here), the least of them, and nulls for a partition
// without one. A stage that this process does not poll, and a node that keeps no state, have none.
func TestTheGraphShowsWatermarks(t *testing.T) {
	plan, _, diags := flow.Build(filepath.Join("..", "..", "examples", "pipelines", "revenue"), flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	taken := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	snap := runtime.Snapshot{Taken: taken, Partitions: []runtime.PartitionState{
		{Node: "orders_once", Topic: "orders", Partition: 0, Watermark: taken.Add(2500 * time.Millisecond)},
		{Node: "revenue_per_minute", Topic: "orders_once.out", Partition: 0},
		{Node: "revenue", Topic: "revenue_per_minute.out", Partition: 0},
	}}
	_, body := get(t, web.NewHandler(snapshotOf{plan: plan, snap: snap}, nil), "/api/graph")
	var g struct {
		Nodes []struct {
			ID        string          `json:"id"`
			Watermark json.RawMessage `json:"watermark"`
		} `json:"nodes"`
	}
	want := map[string]string{
		"stage.orders_once": `{"topic":"orders","least":"2026-01-02T03:04:07.5Z","lag_seconds":-2.5,` +
			`"partitions":[{"partition":0,"watermark":"2026-01-02T03:04:07.5Z","lag_seconds":-2.5}]}`,
		"stage.revenue_per_minute": `{"topic":"orders_once.out","least":null,"lag_seconds":null,` +
			`"partitions":[{"partition":0,"watermark":null,"lag_seconds":null}]}`,
	}
	check := func() {
		t.Helper()
		if err := json.Unmarshal([]byte(body), &g); err != nil {
			t.Fatalf("/api/graph: %v\n%s", err, body)
		}
		for _, n := range g.Nodes {
			if got := string(n.Watermark); got != want[n.ID] {
				t.Errorf("%s: watermark %s, want %s", n.ID, got, cmpOr(want[n.ID], "none"))
			}
		}
	}
	check()

	// The stateful stages not polled (this process does not run them): no watermark.
	snap.Partitions = snap.Partitions[2:]
	_, body = get(t, web.NewHandler(snapshotOf{plan: plan, snap: snap}, nil), "/api/graph")
	g.Nodes, want = nil, nil
	check()
}

func cmpOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// TestTheGraphShowsUpstreamLag: a source that reports how much its upstream system still holds
// for it has that lag in its progress; one that reports none has no such field.
func TestTheGraphShowsUpstreamLag(t *testing.T) {
	plan, _, diags := flow.Build(filepath.Join("..", "..", "examples", "pipelines", "enrich"), flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	snap := runtime.Snapshot{Sources: []runtime.SourceProgress{
		{Name: "orders", Produced: 5, UpstreamLag: 1234},
		{Name: "customers", Produced: 3, UpstreamLag: -1},
	}}
	_, body := get(t, web.NewHandler(snapshotOf{plan: plan, snap: snap}, nil), "/api/graph")
	var g struct {
		Nodes []struct {
			ID       string          `json:"id"`
			Progress json.RawMessage `json:"progress"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		t.Fatalf("/api/graph: %v\n%s", err, body)
	}
	want := map[string]string{
		"source.orders":    `{"produced":5,"done":false,"upstream_lag":1234}`,
		"source.customers": `{"produced":3,"done":false}`,
	}
	for _, n := range g.Nodes {
		if w, ok := want[n.ID]; ok && string(n.Progress) != w {
			t.Errorf("%s: progress %s, want %s", n.ID, n.Progress, w)
		}
	}
}

// TestTheGraphShowsHistoryAndLastDeadLetters: a node's history (its rate, and its input's lag with
// null where it was not known) and its last dead letters, newest first, are in /api/graph, with
// what the history covers; a topic has neither.
func TestTheGraphShowsHistoryAndLastDeadLetters(t *testing.T) {
	plan, _, diags := flow.Build(filepath.Join("..", "..", "examples", "pipelines", "revenue"), flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b := busy{plan: plan,
		snap: runtime.Snapshot{Taken: t0, Nodes: []runtime.NodeSummary{{Name: "orders_once", Type: "stage", Kind: "dedupe", In: 3, DeadLettered: 2,
			LastDeadLetters: []runtime.RecentDeadLetter{{At: t0, Reason: "second"}, {At: t0.Add(-time.Second), Reason: "first"}}}}},
		hist: runtime.History{Step: 10 * time.Second, Times: []time.Time{t0.Add(-10 * time.Second), t0},
			Nodes: map[string]runtime.NodeHistory{"orders_once": {Rate: []float64{1.5, 0.25}, Lag: []int64{-1, 7}}}}}
	_, body := get(t, web.NewHandler(b, nil), "/api/graph")
	var g struct {
		History json.RawMessage `json:"history"`
		Nodes   []struct {
			ID              string          `json:"id"`
			History         json.RawMessage `json:"history"`
			LastDeadLetters json.RawMessage `json:"last_dead_letters"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		t.Fatalf("/api/graph: %v\n%s", err, body)
	}
	if want := `{"step_seconds":10,"points":2,"since":"2026-01-02T03:03:55Z","until":"2026-01-02T03:04:05Z"}`; string(g.History) != want {
		t.Errorf("history %s, want %s", g.History, want)
	}
	for _, n := range g.Nodes {
		history, last := string(n.History), string(n.LastDeadLetters)
		if n.ID == "stage.orders_once" {
			if want := `{"rate":[1.5,0.25],"lag":[null,7]}`; history != want {
				t.Errorf("%s: history %s, want %s", n.ID, history, want)
			}
			if want := `[{"at":"2026-01-02T03:04:05Z","reason":"second"},{"at":"2026-01-02T03:04:04Z","reason":"first"}]`; last != want {
				t.Errorf("%s: last dead letters %s, want %s", n.ID, last, want)
			}
			continue
		}
		if last != "" || (strings.HasPrefix(n.ID, "topic.") && history != "") {
			t.Errorf("%s: history %s, last dead letters %s", n.ID, history, last)
		}
	}
}

// TestTheLayoutFitsAScreen lays out every example and a pipeline of 30 nodes: each drawing, scaled
// to a 1280x800 screen, keeps at least half its size (a long pipeline is cut into bands rather
// than drawn on one row), no two boxes overlap, and no edge that runs along a lane crosses a box.
func TestTheLayoutFitsAScreen(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "..", "examples", "pipelines", "*"))
	if err != nil {
		t.Fatal(err)
	}
	plans := map[string]*flow.Plan{"thirty": thirtyNodes(t)}
	for _, dir := range dirs {
		if plan, _, diags := flow.Build(dir, flow.Options{GoFuncs: stages.Names()}); !diags.HasErrors() && plan != nil {
			plans[filepath.Base(dir)] = plan
		}
	}
	if len(plans) < 10 {
		t.Fatalf("only %d pipelines to lay out", len(plans))
	}
	type rect struct{ x0, y0, x1, y1 int }
	for name, plan := range plans {
		_, body := get(t, web.NewHandler(still{plan: plan}, nil), "/api/graph")
		var g struct {
			Layout struct{ Width, Height int }
			Nodes  []struct {
				ID                  string
				X, Y, Width, Height int
			}
			Edges []struct {
				From, To string
				Points   [][2]int
			}
		}
		if err := json.Unmarshal([]byte(body), &g); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if scale := min(1250/float64(g.Layout.Width), 700/float64(g.Layout.Height)); scale < 0.5 {
			t.Errorf("%s: the drawing is %dx%d, scaled by %.2f to fit a screen", name, g.Layout.Width, g.Layout.Height, scale)
		}
		boxes := map[string]rect{}
		for _, n := range g.Nodes {
			boxes[n.ID] = rect{n.X, n.Y, n.X + n.Width, n.Y + n.Height}
			if n.X < 0 || n.Y < 0 || n.X+n.Width > g.Layout.Width || n.Y+n.Height > g.Layout.Height {
				t.Errorf("%s: %s at %+v is outside the drawing", name, n.ID, boxes[n.ID])
			}
		}
		for a, ra := range boxes {
			for b, rb := range boxes {
				if a < b && ra.x0 < rb.x1 && rb.x0 < ra.x1 && ra.y0 < rb.y1 && rb.y0 < ra.y1 {
					t.Errorf("%s: %s %+v and %s %+v overlap", name, a, ra, b, rb)
				}
			}
		}
		for _, e := range g.Edges {
			if len(e.Points) == 2 {
				continue // between neighbouring layers of a band: a curve through the gap between them
			}
			for i := 1; i < len(e.Points); i++ {
				p, q := e.Points[i-1], e.Points[i]
				seg := rect{min(p[0], q[0]), min(p[1], q[1]), max(p[0], q[0]), max(p[1], q[1])}
				for id, r := range boxes {
					// Strictly inside: a segment may end on its own box's side.
					if seg.x0 < r.x1 && r.x0 < seg.x1 && seg.y0 < r.y1 && r.y0 < seg.y1 ||
						seg.x0 == seg.x1 && r.x0 < seg.x0 && seg.x0 < r.x1 && seg.y0 < r.y1 && r.y0 < seg.y1 ||
						seg.y0 == seg.y1 && r.y0 < seg.y0 && seg.y0 < r.y1 && seg.x0 < r.x1 && r.x0 < seg.x1 {
						t.Errorf("%s: edge %s -> %s crosses %s from %v to %v", name, e.From, e.To, id, p, q)
					}
				}
			}
		}
	}
}
