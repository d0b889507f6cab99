package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// service is a pipeline running as a service in the test's process.
type service struct {
	rt   *runtime.Runtime
	log  *syncBuffer
	out  *syncBuffer
	stop func()
}

// startService runs a plan as a service until the test ends (or stop is called), polling the streams
// often so that snapshots follow quickly.
func startService(t *testing.T, c *redis.Client, plan *flow.Plan, opts runtime.Options, before ...func(*runtime.Runtime)) *service {
	t.Helper()
	s := &service{log: &syncBuffer{}, out: &syncBuffer{}}
	opts.Redis = c
	opts.Logger = newLogger(s.log)
	if opts.Stdout == nil {
		opts.Stdout = s.out
	}
	if opts.Stdin == nil {
		opts.Stdin = strings.NewReader("")
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 20 * time.Millisecond
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 30 * time.Second
	}
	rt, err := runtime.New(plan, opts)
	if err != nil {
		t.Fatal(err)
	}
	s.rt = rt
	for _, f := range before {
		f(rt)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := rt.Run(ctx)
		done <- err
	}()
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v\n%s", err, s.log.String())
		}
	}
	t.Cleanup(s.stop)
	// The runtime sets its start time when Run begins, without a lock: a Snapshot taken before that
	// would race with it. The log line that follows the start orders the two (syncBuffer's mutex).
	waitFor(t, "the pipeline to start", func() bool { return strings.Contains(s.log.String(), "pipeline starting") })
	return s
}

// withRateSampling makes a service sample its counters for rates every interval, over window
// intervals.
func withRateSampling(every time.Duration, window int) func(*runtime.Runtime) {
	return func(rt *runtime.Runtime) { runtime.SetRateSampling(rt, every, window) }
}

// get requests a path from the handler and returns the status and body.
func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, string(body)
}

func TestHTTPHealthAndReadiness(t *testing.T) {
	c := server.open(t)
	plan := buildTestdata(t, "web.hcl")
	rt, err := runtime.New(plan, runtime.Options{Redis: c})
	if err != nil {
		t.Fatal(err)
	}
	h := web.NewHandler(rt, nil)
	if code, body := get(t, h, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "has not started") {
		t.Errorf("/readyz before the run: %d %q", code, body)
	}
	if code, body := get(t, h, "/metrics"); code != http.StatusNotFound || strings.Count(body, "\n") != 1 || !strings.Contains(body, "metrics") {
		t.Errorf("/metrics without a handler: %d %q", code, body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/readyz", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /readyz: %d", rec.Code)
	}

	s := startService(t, c, buildTestdata(t, "web.hcl"), runtime.Options{})
	h = web.NewHandler(s.rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "flowrun_messages_total 0\n")
	}))
	waitFor(t, "/readyz to answer 200", func() bool {
		code, body := get(t, h, "/readyz")
		return code == http.StatusOK && body == "ready\n"
	})
	if code, body := get(t, h, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz while running: %d %q", code, body)
	}
	if code, body := get(t, h, "/metrics"); code != http.StatusOK || body != "flowrun_messages_total 0\n" {
		t.Errorf("/metrics is not delegated: %d %q", code, body)
	}
}

// graphDoc is /api/graph as the tests read it.
type graphDoc struct {
	Pipeline struct {
		Name  string `json:"name"`
		Sinks []struct {
			Name   string         `json:"name"`
			Config map[string]any `json:"config"`
		} `json:"sinks"`
	} `json:"pipeline"`
	Taken    string  `json:"taken"`
	Elapsed  float64 `json:"elapsed_seconds"`
	Polled   *string `json:"polled"`
	Ready    bool    `json:"ready"`
	NotReady string  `json:"not_ready"`
	Rates    struct {
		Since   *string `json:"since"`
		Until   *string `json:"until"`
		Seconds float64 `json:"seconds"`
	} `json:"rates"`
	Layout struct {
		Width  int `json:"width"`
		Height int `json:"height"`
	} `json:"layout"`
	Nodes []graphNode `json:"nodes"`
	Edges []graphEdge `json:"edges"`
}

type graphNode struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Detail   string `json:"detail"`
	Layer    int    `json:"layer"`
	Band     int    `json:"band"`
	X        int    `json:"x"`
	Y        int    `json:"y"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
	Counters *struct {
		In             int64 `json:"in"`
		Out            int64 `json:"out"`
		Filtered       int64 `json:"filtered"`
		Dropped        int64 `json:"dropped"`
		Absorbed       int64 `json:"absorbed"`
		DeadLettered   int64 `json:"dead_lettered"`
		InFlight       int64 `json:"in_flight"`
		Written        int64 `json:"written"`
		FailedAttempts int64 `json:"failed_attempts"`
		Retries        int64 `json:"retries"`
	} `json:"counters"`
	DeadLetters *int64 `json:"dead_letters"`
	Paused      *struct {
		Reason string `json:"reason"`
	} `json:"paused"`
	HeldBackBy string `json:"held_back_by"`
	Stream     *struct {
		Stream  string `json:"stream"`
		Length  int64  `json:"length"`
		Lag     int64  `json:"lag"`
		Pending int64  `json:"pending"`
	} `json:"stream"`
	Partitions       int `json:"partitions"`
	PartitionLengths []struct {
		Partition int   `json:"partition"`
		Length    int64 `json:"length"`
	} `json:"partition_lengths"`
}

type graphEdge struct {
	From       string   `json:"from"`
	To         string   `json:"to"`
	Kind       string   `json:"kind"`
	Topic      string   `json:"topic"`
	Implicit   bool     `json:"implicit"`
	Rate       *float64 `json:"rate"`
	Lag        *int64   `json:"lag"`
	Pending    *int64   `json:"pending"`
	Partitions []struct {
		Partition int   `json:"partition"`
		Length    int64 `json:"length"`
		Lag       int64 `json:"lag"`
		Pending   int64 `json:"pending"`
	} `json:"partitions"`
	Points  [][2]int `json:"points"`
	LabelAt [2]int   `json:"label_at"`
}

// getGraph requests /api/graph and decodes it; raw is the body as served.
func getGraph(t *testing.T, h http.Handler) (g graphDoc, raw string) {
	t.Helper()
	code, body := get(t, h, "/api/graph")
	if code != http.StatusOK {
		t.Fatalf("/api/graph: %d %s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		t.Fatalf("/api/graph: %v\n%s", err, body)
	}
	return g, body
}

func (g graphDoc) node(t *testing.T, id string) graphNode {
	t.Helper()
	for _, n := range g.Nodes {
		if n.ID == id {
			return n
		}
	}
	t.Fatalf("no node %s in %+v", id, g.Nodes)
	return graphNode{}
}

func (g graphDoc) edge(t *testing.T, from, to string) graphEdge {
	t.Helper()
	for _, e := range g.Edges {
		if e.From == from && e.To == to {
			return e
		}
	}
	t.Fatalf("no edge %s -> %s in %+v", from, to, g.Edges)
	return graphEdge{}
}

const webPipeline = `
pipeline "web" {}
variable "hook" {}
variable "token" {
  sensitive = true
}
topic "orders" {
  partitions = 2
  key        = msg.k
}
stage "gate" {
  kind     = "go"
  func     = "test.gate"
  input    = topic.orders
  ordering = "partition"
  timeout  = "10m"
}
stage "price" {
  kind  = "map"
  input = stage.gate
  set   = { cents = tonumber(msg.amount) * 100 }
}
sink "hook" {
  kind    = "http"
  input   = stage.price
  url     = var.hook
  headers = { Authorization = "Bearer ${var.token}" }
}
`

// TestHTTPGraph follows a pipeline through /api/graph: ten messages wait in front of a stage held
// by a gate (lag and pending), then flow (counters, rates), three of them dead-lettered by a map
// stage whose expression fails on them; the sensitive token of the http sink never shows.
func TestHTTPGraph(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	const token = "tok-5ecret-c0ffee"
	var delivered atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+token {
			delivered.Add(1)
		}
	}))
	defer hook.Close()
	plan := buildSource(t, webPipeline, "hook="+hook.URL, "token="+token)
	// One entry per read: the gate holds the first message, the rest wait unread behind it. Rates
	// are sampled often, so that they fall back to 0 soon once the work is done.
	s := startService(t, c, plan, runtime.Options{BatchSize: 1}, withRateSampling(20*time.Millisecond, 5))
	h := web.NewHandler(s.rt, nil)

	// Rates come from the runtime's samples of its counters: every request answered from the same
	// sample (the same window) shows the same rates, however many requests there are.
	byWindow := map[string]map[string]float64{}
	var sawRate bool
	fetch := func() (graphDoc, string) {
		g, raw := getGraph(t, h)
		if g.Rates.Until == nil {
			return g, raw
		}
		rates := map[string]float64{}
		for _, e := range g.Edges {
			if e.Rate != nil {
				rates[e.From+">"+e.To] = *e.Rate
				sawRate = sawRate || *e.Rate > 0
			}
		}
		if before, ok := byWindow[*g.Rates.Until]; ok && !maps.Equal(before, rates) {
			t.Errorf("the window ending %s had rates %v, now %v", *g.Rates.Until, before, rates)
		}
		byWindow[*g.Rates.Until] = rates
		return g, raw
	}

	// The shape, before anything flows.
	g, raw := fetch()
	if g.Pipeline.Name != "web" || len(g.Pipeline.Sinks) != 1 {
		t.Fatalf("pipeline %+v", g.Pipeline)
	}
	if auth := g.Pipeline.Sinks[0].Config["headers"].(map[string]any)["Authorization"]; auth != "Bearer (sensitive)" {
		t.Errorf("the sink's header reads %q", auth)
	}
	var ids []string
	for _, n := range g.Nodes {
		ids = append(ids, n.ID)
	}
	if got := strings.Join(ids, " "); got != "topic.orders stage.gate stage.price sink.hook" {
		t.Errorf("nodes %s; implicit topics are drawn as edges", got)
	}
	for i, want := range []string{"topic.orders", "stage.gate", "stage.price", "sink.hook"} {
		if n := g.node(t, want); n.Layer != i {
			t.Errorf("%s in layer %d, want %d", want, n.Layer, i)
		}
	}
	if e := g.edge(t, "stage.gate", "stage.price"); e.Kind != "reads" || !e.Implicit || e.Topic != "gate.out" {
		t.Errorf("gate -> price: %+v", e)
	}
	for _, e := range g.Edges {
		if e.Rate == nil || *e.Rate != 0 {
			t.Errorf("%s -> %s: the rate before anything flows is %v, want 0", e.From, e.To, e.Rate)
		}
	}
	if n := g.node(t, "stage.price"); n.Counters == nil || n.Counters.In != 0 || n.Kind != "map" || n.Detail != "map stage · fused" {
		t.Errorf("price before the run's work: %+v", n)
	}
	if n := g.node(t, "topic.orders"); n.Partitions != 2 || n.Counters != nil {
		t.Errorf("topic: %+v", n)
	}
	checkNoSecret(t, raw, token)

	// test.gate (see faults_test.go) holds message 0 of the run until the gate opens.
	run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
	gate := &gate{entered: make(chan struct{}), open: make(chan struct{})}
	gates.Store(run, gate)
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate.open) }) }
	t.Cleanup(open)
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		amount := fmt.Sprint(i * 10)
		if i%3 == 1 {
			amount = "n/a" // 1, 4, 7: price cannot compute cents
		}
		payload := fmt.Sprintf(`{"k":"a","i":%d,"amount":%q,"run":%q}`, i, amount, run)
		if err := pub.Publish(ctx, "orders", stages.NewMessage("", []byte(payload), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Held: one entry read and pending, nine not yet read, all in the partition of key "a". The
	// entry at the gate is not counted in yet: a message counts when its batch commits.
	waitFor(t, "lag 9 and 1 pending in front of the gate", func() bool {
		g, _ := fetch()
		e := g.edge(t, "topic.orders", "stage.gate")
		return e.Lag != nil && *e.Lag == 9 && *e.Pending == 1
	})
	g, _ = fetch()
	if c := g.node(t, "stage.gate").Counters; c.In != 0 {
		t.Errorf("the gate counted %d in while its batch is being processed: %+v", c.In, *c)
	}
	e := g.edge(t, "topic.orders", "stage.gate")
	if len(e.Partitions) != 2 {
		t.Fatalf("partitions %+v", e.Partitions)
	}
	var lag, pending, length int64
	for i, p := range e.Partitions {
		if p.Partition != i {
			t.Errorf("partition %d listed as %d", i, p.Partition)
		}
		lag, pending, length = lag+p.Lag, pending+p.Pending, length+p.Length
	}
	if lag != 9 || pending != 1 || length != 10 {
		t.Errorf("partitions sum to lag %d, pending %d, length %d: %+v", lag, pending, length, e.Partitions)
	}
	var topicLength int64
	for _, p := range g.node(t, "topic.orders").PartitionLengths {
		topicLength += p.Length
	}
	if topicLength != 10 {
		t.Errorf("the topic's partitions hold %d entries, want 10", topicLength)
	}

	// Flowing.
	open()
	waitFor(t, "every message to reach the hook or the dead letters, and a rate above 0", func() bool {
		g, _ := fetch()
		price := g.node(t, "stage.price")
		return sawRate && delivered.Load() == 7 && g.node(t, "sink.hook").Counters.In == 7 &&
			price.DeadLetters != nil && *price.DeadLetters == 3 && *g.edge(t, "topic.orders", "stage.gate").Lag == 0
	})
	waitFor(t, "the rates to fall back to 0", func() bool {
		g, _ := fetch()
		return g.Rates.Since != nil && *g.edge(t, "topic.orders", "stage.gate").Rate == 0 &&
			*g.edge(t, "stage.price", "sink.hook").Rate == 0
	})

	g, raw = fetch()
	price := g.node(t, "stage.price")
	if c := price.Counters; c.In != 10 || c.Out != 7 || c.DeadLettered != 3 {
		t.Errorf("price counters %+v", c)
	}
	if n := g.node(t, "sink.hook"); n.Counters.In != 7 || *n.DeadLetters != 0 {
		t.Errorf("hook %+v", n)
	}
	for _, e := range g.Edges {
		if e.Kind == "reads" && (*e.Lag != 0 || *e.Pending != 0) {
			t.Errorf("%s -> %s: lag %d, pending %d after the work is done", e.From, e.To, *e.Lag, *e.Pending)
		}
	}
	if !g.Ready || g.Polled == nil || g.Elapsed <= 0 {
		t.Errorf("ready %v (%s), polled %v, elapsed %v", g.Ready, g.NotReady, g.Polled, g.Elapsed)
	}
	checkNoSecret(t, raw, token)
}

func checkNoSecret(t *testing.T, body, secret string) {
	t.Helper()
	if strings.Contains(body, secret) {
		t.Errorf("/api/graph shows the sensitive value:\n%s", body)
	}
	if !strings.Contains(body, "(sensitive)") {
		t.Errorf("/api/graph does not show where the sensitive value was redacted:\n%s", body)
	}
}

// TestHTTPGraphLayout checks the drawing of every example and of a pipeline whose dead letters loop
// back: each node in a box of its own, layers left to right along the edges, and each edge from its
// source's box to its target's, without crossing a box.
func TestHTTPGraphLayout(t *testing.T) {
	c := server.open(t)
	plans := map[string]*flow.Plan{
		"loop": buildSource(t, `
pipeline "loop" {}
topic "in" {}
topic "out" {}
topic "failed" {}
source "gen" {
  kind     = "generate"
  count    = 1
  output   = topic.in
  template = { n = index }
}
stage "work" {
  kind        = "map"
  input       = topic.in
  output      = topic.out
  dead_letter = topic.failed
  set         = { m = msg.n * 2 }
}
stage "repair" {
  kind   = "map"
  input  = topic.failed
  output = topic.in
  set    = { n = 0 }
}
sink "done" {
  kind  = "stdout"
  input = topic.out
}
`),
	}
	entries, err := os.ReadDir(examples)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !flow.IsTestFile(e.Name()) {
			plans[e.Name()] = build(t, filepath.Join(examples, e.Name()))
		}
	}
	for name, plan := range plans {
		t.Run(name, func(t *testing.T) {
			rt, err := runtime.New(plan, runtime.Options{Redis: c})
			if err != nil {
				t.Fatal(err)
			}
			g, _ := getGraph(t, web.NewHandler(rt, nil))
			checkLayout(t, plan, g)
			if name != "loop" {
				for _, e := range g.Edges {
					if from, to := g.node(t, e.From), g.node(t, e.To); to.Layer <= from.Layer {
						t.Errorf("%s -> %s goes from layer %d to %d", e.From, e.To, from.Layer, to.Layer)
					}
				}
				return
			}
			for want, ids := range [][]string{{"source.gen"}, {"topic.in"}, {"stage.work"}, {"topic.out", "topic.failed"}, {"sink.done", "stage.repair"}} {
				for _, id := range ids {
					if n := g.node(t, id); n.Layer != want {
						t.Errorf("%s in layer %d, want %d", id, n.Layer, want)
					}
				}
			}
			if e := g.edge(t, "stage.repair", "topic.in"); len(e.Points) < 4 {
				t.Errorf("the edge back from repair is drawn through the boxes: %v", e.Points)
			}
		})
	}
}

func checkLayout(t *testing.T, plan *flow.Plan, g graphDoc) {
	t.Helper()
	want := 0
	for _, tp := range plan.Topics {
		if !tp.Implicit {
			want++
		}
	}
	if want += len(plan.Sources) + len(plan.Stages) + len(plan.Sinks); len(g.Nodes) != want {
		t.Errorf("%d nodes, want %d", len(g.Nodes), want)
	}
	inside := func(x, y int) bool { return x >= 0 && y >= 0 && x <= g.Layout.Width && y <= g.Layout.Height }
	for i, a := range g.Nodes {
		if a.Width <= 0 || a.Height <= 0 || !inside(a.X, a.Y) || !inside(a.X+a.Width, a.Y+a.Height) {
			t.Errorf("%s: box %d,%d %dx%d in a %dx%d drawing", a.ID, a.X, a.Y, a.Width, a.Height, g.Layout.Width, g.Layout.Height)
		}
		for _, b := range g.Nodes[i+1:] {
			if a.X < b.X+b.Width && b.X < a.X+a.Width && a.Y < b.Y+b.Height && b.Y < a.Y+a.Height {
				t.Errorf("%s and %s overlap", a.ID, b.ID)
			}
			// Layers go left to right within a band, and bands top to bottom.
			if a.Layer != b.Layer && ((a.Band == b.Band && (a.Layer < b.Layer) != (a.X < b.X)) ||
				(a.Band != b.Band && ((a.Layer < b.Layer) != (a.Band < b.Band) || (a.Band < b.Band) != (a.Y < b.Y)))) {
				t.Errorf("%s (layer %d, band %d, x %d, y %d) and %s (layer %d, band %d, x %d, y %d) are not in reading order",
					a.ID, a.Layer, a.Band, a.X, a.Y, b.ID, b.Layer, b.Band, b.X, b.Y)
			}
		}
	}
	for _, e := range g.Edges {
		from, to := g.node(t, e.From), g.node(t, e.To)
		if len(e.Points) < 2 {
			t.Errorf("%s -> %s: points %v", e.From, e.To, e.Points)
			continue
		}
		first, last := e.Points[0], e.Points[len(e.Points)-1]
		if first != [2]int{from.X + from.Width, from.Y + from.Height/2} || last != [2]int{to.X, to.Y + to.Height/2} {
			t.Errorf("%s -> %s: from %v to %v, not between the boxes", e.From, e.To, first, last)
		}
		// A straight edge joins neighbouring layers; a longer one keeps out of every box.
		if len(e.Points) == 2 && to.Layer != from.Layer+1 {
			t.Errorf("%s -> %s joins layers %d and %d directly", e.From, e.To, from.Layer, to.Layer)
		}
		for i := 0; len(e.Points) > 2 && i+1 < len(e.Points); i++ {
			p, q := e.Points[i], e.Points[i+1]
			for _, n := range g.Nodes {
				if segmentCrosses(p, q, n) {
					t.Errorf("%s -> %s: segment %v-%v crosses %s", e.From, e.To, p, q, n.ID)
				}
			}
		}
		for _, p := range append(e.Points, e.LabelAt) {
			if !inside(p[0], p[1]) {
				t.Errorf("%s -> %s: %v outside the drawing", e.From, e.To, p)
			}
		}
	}
}

// segmentCrosses reports whether a horizontal or vertical segment passes through the inside of a
// node's box.
func segmentCrosses(p, q [2]int, n graphNode) bool {
	x0, x1 := min(p[0], q[0]), max(p[0], q[0])
	y0, y1 := min(p[1], q[1]), max(p[1], q[1])
	overlaps := func(a0, a1, b0, b1 int) bool { return a0 < b1 && b0 < a1 || a0 == a1 && b0 < a0 && a0 < b1 }
	return overlaps(x0, x1, n.X, n.X+n.Width) && overlaps(y0, y1, n.Y, n.Y+n.Height)
}

// TestHTTPPage serves the page and its assets, which load nothing from elsewhere.
func TestHTTPPage(t *testing.T) {
	rt, err := runtime.New(buildTestdata(t, "web.hcl"), runtime.Options{Redis: server.open(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := web.NewHandler(rt, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	page := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(page, `<svg id="graph"`) {
		t.Fatalf("/: %d %s\n%s", rec.Code, rec.Header(), page)
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	for _, asset := range []string{"/app.js", "/style.css"} {
		code, body := get(t, h, asset)
		if code != http.StatusOK || len(body) < 100 {
			t.Errorf("%s: %d, %d bytes", asset, code, len(body))
		}
		page += body
	}
	// The only URL may be the SVG namespace, which names and fetches nothing.
	for _, bad := range []string{"https://", "//cdn", "@import", "url(http", `src="http`, `href="http`} {
		if strings.Contains(page, bad) {
			t.Errorf("the page refers to something elsewhere (%q)", bad)
		}
	}
	if n := strings.Count(page, "http://"); n != strings.Count(page, "http://www.w3.org/2000/svg") {
		t.Errorf("the page has URLs besides the SVG namespace")
	}
	if code, _ := get(t, h, "/nothing-here"); code != http.StatusNotFound {
		t.Errorf("/nothing-here: %d", code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d", rec.Code)
	}
}

// TestRunServesHTTP runs flowrun run --http with a port alone: it listens on the loopback interface,
// says where, serves while the pipeline runs and stops with it. A second process asked for the same
// address fails with exit status 1, naming it.
func TestRunServesHTTP(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := fmt.Sprintf("http-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "pipeline.hcl")
	writeFile(t, path, fmt.Sprintf(`
pipeline "served" {
  key_prefix = %q
}
topic "in" { partitions = 2 }
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`, prefix))
	p := startProcess(t, "run", path, "--redis", srv.URL(), "--http", ":0")
	urlPattern := regexp.MustCompile(`msg="serving HTTP" url=(http://\S+/)`)
	var base string
	waitFor(t, "the URL in the log", func() bool {
		m := urlPattern.FindStringSubmatch(p.log.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})
	u, err := url.Parse(base)
	if err != nil || u.Hostname() != "127.0.0.1" {
		t.Fatalf("serving on %q: a port alone must bind 127.0.0.1", base)
	}
	fetch := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	if code, body := fetch("healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	waitFor(t, "/readyz to answer 200", func() bool {
		code, _ := fetch("readyz")
		return code == http.StatusOK
	})
	if code, body := fetch("api/graph"); code != http.StatusOK || !strings.Contains(body, `"name":"served"`) {
		t.Errorf("/api/graph: %d %s", code, body)
	}

	second := startProcess(t, "run", path, "--redis", srv.URL(), "--http", u.Host, "--until-drained")
	err = waitProcess(t, second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(second.log.String(), u.Host) {
		t.Errorf("a second server on %s: %v\n%s", u.Host, err, second.log.String())
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitProcess(t, p); err != nil {
		t.Fatalf("flowrun run --http did not exit cleanly on SIGTERM: %v\n%s", err, p.log.String())
	}
	if resp, err := http.Get(base + "healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("the server still answers after the run ended")
	}
}
