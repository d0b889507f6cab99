package runtime

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"sort"
	"time"

	"github.com/flowrun/flowrun/flow"
)

// NewHTTPHandler serves a running pipeline's health, readiness, metrics and a live page of its graph:
//
//   - /healthz answers 200 "ok" as long as the process serves requests;
//   - /readyz answers 200 once Ready reports nothing wrong, and 503 with the reason until then;
//   - /metrics is served by metrics (a Prometheus handler, say); when metrics is nil it answers 404;
//   - /api/graph is the plan (as Plan.Describe gives it, sensitive values redacted) with what each
//     node and edge is doing now, and where to draw each node;
//   - / is a page that draws the graph from /api/graph every second.
//
// The handler only reads: it changes nothing in the pipeline or in Redis. Counters and rates are this
// process's; lag, pending entries and dead-letter lengths are read from Redis and so cover every
// process running the pipeline.
func NewHTTPHandler(rt *Runtime, metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := rt.Ready(); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+rt.Plan().Redact(err.Error()))
			return
		}
		writeText(w, http.StatusOK, "ready")
	})
	if metrics != nil {
		mux.Handle("/metrics", metrics)
	} else {
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
			writeText(w, http.StatusNotFound, "metrics are not enabled in this process")
		})
	}
	mux.Handle("GET /api/graph", newGraphHandler(rt))
	mux.Handle("/", pageHandler())
	return mux
}

// writeText answers with one line of plain text.
func writeText(w http.ResponseWriter, status int, line string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(line + "\n"))
}

// The page: index.html, app.js and style.css, served as they are. They load nothing from elsewhere,
// and the Content-Security-Policy keeps it that way.

//go:embed web
var webFiles embed.FS

func pageHandler() http.Handler {
	files, err := fs.Sub(webFiles, "web")
	if err != nil {
		panic(err) // the directory is embedded: this cannot fail
	}
	static := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeText(w, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
			"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		static.ServeHTTP(w, r)
	})
}

// The graph as /api/graph serves it. Its shape (nodes, edges, layout) comes from the plan and is
// computed once; the numbers come from a Snapshot at each request.

type graphJSON struct {
	// Pipeline is the plan as Plan.Describe gives it.
	Pipeline       map[string]any `json:"pipeline"`
	Taken          time.Time      `json:"taken"`
	ElapsedSeconds float64        `json:"elapsed_seconds"`
	// Polled is when Redis was last read for lag, pending entries and dead letters; null before.
	Polled    *time.Time `json:"polled"`
	PollError string     `json:"poll_error,omitempty"`
	// RedisFailingSince is when this process's calls to Redis began to fail, while they do.
	RedisFailingSince *time.Time `json:"redis_failing_since,omitempty"`
	Ready             bool       `json:"ready"`
	NotReady          string     `json:"not_ready,omitempty"` // why not, when not ready
	Leases            int        `json:"leases"`
	Rates             rateWindow `json:"rates"`
	Layout            layoutSize `json:"layout"`
	Nodes             []nodeJSON `json:"nodes"`
	Edges             []edgeJSON `json:"edges"`
}

// rateWindow is the interval that the edges' rates are measured over: between two of the samples
// of the counters that the runtime takes every second, the last one and one about five seconds
// before. Since and Until are null, and every rate 0, until there are two samples.
type rateWindow struct {
	Since   *time.Time `json:"since"`
	Until   *time.Time `json:"until"`
	Seconds float64    `json:"seconds"`
}

type layoutSize struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

type nodeJSON struct {
	ID     string `json:"id"`   // the address: source.NAME, topic.NAME, stage.NAME or sink.NAME
	Type   string `json:"type"` // source, topic, stage or sink
	Name   string `json:"name"`
	Kind   string `json:"kind,omitempty"` // the source's, stage's or sink's kind
	Detail string `json:"detail"`         // a short description: "map stage", "4 partitions"
	// Layer is the node's depth in the graph; X and Y (its top left corner), Width and Height place
	// it in a drawing of Layout's size.
	Layer  int `json:"layer"`
	X      int `json:"x"`
	Y      int `json:"y"`
	Width  int `json:"width"`
	Height int `json:"height"`

	// Sources, stages and sinks: their counters since this process started (absent when this
	// process does not run the node), the length of their own dead-letter stream, and the topic
	// their dead letters go to instead, if they name one.
	Counters        *countersJSON `json:"counters,omitempty"`
	DeadLetters     *int64        `json:"dead_letters,omitempty"`
	DeadLetterTopic string        `json:"dead_letter_topic,omitempty"`
	// Progress is a producing source's (generate, file, stdin).
	Progress *progressJSON `json:"progress,omitempty"`
	// Stream is a redis_stream source's input, as of the last poll, when this process runs it.
	Stream *streamJSON `json:"stream,omitempty"`
	// Paused is set while the node's attempts fail transiently: it waits for its downstream.
	Paused *pausedJSON `json:"paused,omitempty"`
	// HeldBackBy names the topic at its max_lag that the node waits for, while it does;
	// HeldBackSeconds is how long its writers waited for capped topics, in all.
	HeldBackBy      string  `json:"held_back_by,omitempty"`
	HeldBackSeconds float64 `json:"held_back_seconds,omitempty"`

	// Topics: the partitions, the key expression and each partition's length as far as the nodes
	// that this process runs read it.
	Partitions       int               `json:"partitions,omitempty"`
	Key              string            `json:"key,omitempty"`
	PartitionLengths []partitionLength `json:"partition_lengths,omitempty"`
}

type countersJSON struct {
	In           int64 `json:"in"`
	Out          int64 `json:"out"`
	Filtered     int64 `json:"filtered"`
	Failed       int64 `json:"failed"`
	Retried      int64 `json:"retried"`
	DeadLettered int64 `json:"dead_lettered"`
}

type pausedJSON struct {
	Since  time.Time `json:"since"`
	Reason string    `json:"reason"` // the last transient failure
}

type progressJSON struct {
	Produced int64 `json:"produced"`
	Total    int64 `json:"total,omitempty"` // absent when the source cannot tell
	Done     bool  `json:"done"`
}

// streamJSON is the stream a redis_stream source reads, with the lag and pending entries of the
// source's consumer group.
type streamJSON struct {
	Stream  string `json:"stream"`
	Length  int64  `json:"length"`
	Lag     int64  `json:"lag"`
	Pending int64  `json:"pending"`
}

type partitionLength struct {
	Partition int   `json:"partition"`
	Length    int64 `json:"length"`
}

type edgeJSON struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Kind  string `json:"kind"` // reads, writes or dead_letter
	Label string `json:"label,omitempty"`
	Topic string `json:"topic"` // the topic the edge carries
	// Implicit marks an edge drawn straight from a stage to a reader of its implicit output topic.
	Implicit bool `json:"implicit,omitempty"`
	// Points is the line to draw, [x, y] pairs from the source's box to the target's: two for an
	// edge between neighbouring layers (drawn as a curve), more for one that runs along a lane
	// below the boxes. LabelAt is where its numbers go.
	Points  [][2]int `json:"points"`
	LabelAt [2]int   `json:"label_at"`
	// Rate is messages per second over Rates: a reads edge counts what its reader read, a writes
	// edge what its writer wrote, a dead_letter edge what its node dead-lettered. Null where this
	// process cannot tell (it does not run the node; a route stage's outputs share one count).
	Rate *float64 `json:"rate"`
	// Lag, Pending and Retries are summed over the reading node's partitions (reads edges of
	// nodes this process runs; null otherwise), and Partitions lists them one by one.
	Lag        *int64          `json:"lag"`
	Pending    *int64          `json:"pending"`
	Retries    *int64          `json:"retries"`
	Partitions []partitionJSON `json:"partitions"`
}

type partitionJSON struct {
	Partition int   `json:"partition"`
	Length    int64 `json:"length"`
	Lag       int64 `json:"lag"`
	Pending   int64 `json:"pending"`
	Retries   int64 `json:"retries"`
}

// graphHandler serves /api/graph.
type graphHandler struct {
	rt       *Runtime
	plan     *flow.Plan
	pipeline map[string]any
	view     graphView
}

func newGraphHandler(rt *Runtime) *graphHandler {
	p := rt.Plan()
	return &graphHandler{rt: rt, plan: p, pipeline: p.Describe(), view: newGraphView(p)}
}

func (g *graphHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s := g.rt.Snapshot()
	ready := g.rt.Ready()
	body, err := json.Marshal(g.describe(s, ready))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(body)
}

// describe combines the graph's shape with a snapshot.
func (g *graphHandler) describe(s Snapshot, ready error) graphJSON {
	counters := map[string]NodeSummary{}
	for _, n := range s.Nodes {
		counters[n.Name] = n
	}
	progress := map[string]SourceProgress{}
	for _, p := range s.Sources {
		progress[p.Name] = p
	}
	partitions := map[string][]PartitionState{}  // by reading node
	lengths := map[string]map[int]int64{}        // by topic, then partition
	sourceStreams := map[string]PartitionState{} // by redis_stream source
	for _, p := range s.Partitions {
		if p.Topic == "" {
			sourceStreams[p.Node] = p
			continue
		}
		partitions[p.Node] = append(partitions[p.Node], p)
		if lengths[p.Topic] == nil {
			lengths[p.Topic] = map[int]int64{}
		}
		if _, seen := lengths[p.Topic][p.Partition]; !seen {
			lengths[p.Topic][p.Partition] = p.Length
		}
	}
	rates := s.Rates

	out := graphJSON{
		Pipeline:       g.pipeline,
		Taken:          s.Taken,
		ElapsedSeconds: s.Elapsed.Seconds(),
		Ready:          ready == nil,
		Leases:         s.Leases,
		Layout:         layoutSize{Width: g.view.width, Height: g.view.height},
		Nodes:          make([]nodeJSON, 0, len(g.view.nodes)),
		Edges:          make([]edgeJSON, 0, len(g.view.edges)),
	}
	if !s.Polled.IsZero() {
		out.Polled = &s.Polled
	}
	if s.PollErr != nil {
		out.PollError = g.plan.Redact(s.PollErr.Error())
	}
	if !s.RedisFailingSince.IsZero() {
		since := s.RedisFailingSince
		out.RedisFailingSince = &since
	}
	if ready != nil {
		out.NotReady = g.plan.Redact(ready.Error())
	}
	if !rates.Since.IsZero() {
		out.Rates = rateWindow{Since: &rates.Since, Until: &rates.Until, Seconds: rates.Seconds()}
	}

	for _, vn := range g.view.nodes {
		n := nodeJSON{
			ID: vn.id, Type: vn.typ, Name: vn.name, Kind: vn.kind, Detail: vn.detail,
			Layer: vn.layer, X: vn.x, Y: vn.y, Width: vn.width, Height: vn.height,
			DeadLetterTopic: vn.deadLetterTopic, Partitions: vn.partitions, Key: vn.key,
		}
		if c, ok := counters[vn.name]; ok && vn.typ != "topic" {
			n.Counters = &countersJSON{In: c.In, Out: c.Out, Filtered: c.Filtered, Failed: c.Failed,
				Retried: c.Retried, DeadLettered: c.DeadLettered}
			if !c.PausedSince.IsZero() {
				n.Paused = &pausedJSON{Since: c.PausedSince, Reason: g.plan.Redact(c.PausedBy)}
			}
			n.HeldBackBy, n.HeldBackSeconds = c.HeldBackBy, c.HeldBack.Seconds()
		}
		if d, ok := s.DeadLetters[vn.name]; ok && vn.typ != "topic" {
			n.DeadLetters = &d
		}
		if p, ok := progress[vn.name]; ok && vn.typ == "source" {
			n.Progress = &progressJSON{Produced: p.Produced, Total: p.Total, Done: p.Done}
		}
		if p, ok := sourceStreams[vn.name]; ok && vn.typ == "source" {
			n.Stream = &streamJSON{Stream: p.Stream, Length: p.Length, Lag: p.Lag, Pending: p.Pending}
		}
		if vn.typ == "topic" {
			for part, length := range lengths[vn.name] {
				n.PartitionLengths = append(n.PartitionLengths, partitionLength{Partition: part, Length: length})
			}
			sort.Slice(n.PartitionLengths, func(i, j int) bool {
				return n.PartitionLengths[i].Partition < n.PartitionLengths[j].Partition
			})
		}
		out.Nodes = append(out.Nodes, n)
	}

	for _, ve := range g.view.edges {
		e := edgeJSON{From: ve.from, To: ve.to, Kind: ve.kind, Label: ve.label, Topic: ve.topic, Implicit: ve.implicit,
			Points: ve.points, LabelAt: ve.labelAt}
		if _, ok := counters[ve.counted]; ok && ve.counted != "" {
			var r float64
			switch nr := rates.Nodes[ve.counted]; ve.kind {
			case string(flow.EdgeReads):
				r = nr.In
			case string(flow.EdgeWrites):
				r = nr.Out
			case string(flow.EdgeDeadLetter):
				r = nr.DeadLettered
			}
			e.Rate = &r
		}
		if ve.reader != "" {
			if parts, ok := partitions[ve.reader]; ok {
				var lag, pending, retries int64
				e.Partitions = make([]partitionJSON, 0, len(parts))
				for _, p := range parts {
					lag, pending, retries = lag+p.Lag, pending+p.Pending, retries+p.Retries
					e.Partitions = append(e.Partitions, partitionJSON{
						Partition: p.Partition, Length: p.Length, Lag: p.Lag, Pending: p.Pending, Retries: p.Retries,
					})
				}
				sort.Slice(e.Partitions, func(i, j int) bool { return e.Partitions[i].Partition < e.Partitions[j].Partition })
				e.Lag, e.Pending, e.Retries = &lag, &pending, &retries
			}
		}
		out.Edges = append(out.Edges, e)
	}
	return out
}

// graphView is the drawing of a plan: sources, declared topics, stages and sinks placed in layers by
// their depth, left to right. A stage read as stage.NAME writes an implicit topic, which is drawn
// as edges straight from the stage to its readers, as flowrun graph draws it.
type graphView struct {
	nodes         []*viewNode
	edges         []*viewEdge
	width, height int
}

type viewNode struct {
	id, typ, name, kind, detail string
	deadLetterTopic, key        string
	partitions                  int
	layer, x, y, width, height  int
	order                       float64 // position within the layer, while ordering
}

type viewEdge struct {
	from, to, kind, label, topic string
	implicit                     bool
	counted                      string // the node whose counter gives the rate; "" when none does
	reader                       string // the node whose input partitions the edge shows
	points                       [][2]int
	labelAt                      [2]int
}

// The drawing's measures, in pixels. The page lays out a node's lines inside the box it is given:
// a title and a detail line, then three rows of counters and a dead-letter line for sources, stages
// and sinks, or rows of four partitions for topics.
const (
	drawMargin      = 24
	drawNodeWidth   = 250
	drawLayerGap    = 140 // room for the edges' labels between layers
	drawRowGap      = 28
	drawNodeHeight  = 128
	drawTopicTop    = 48 // a topic's title and detail
	drawTopicRow    = 18
	drawCellsPerRow = 4
	drawMaxCells    = 32 // more partitions are summed up in one line
	drawLaneGap     = 40 // between the lanes of edges that skip layers
	drawLaneTurn    = 14 // how far from a box such an edge turns to its lane
)

// newGraphView lays out the plan's graph (flow's Plan.Graph, which flowrun graph draws too).
func newGraphView(p *flow.Plan) graphView {
	var v graphView
	g := p.Graph()
	byID := map[string]*viewNode{}
	for _, n := range g.Nodes {
		vn := &viewNode{id: n.ID, typ: n.Type, name: n.Name, kind: n.Kind, detail: n.Detail,
			deadLetterTopic: n.DeadLetterTopic, key: n.Key, partitions: n.Partitions}
		v.nodes = append(v.nodes, vn)
		byID[vn.id] = vn
	}
	writes := map[string]int{} // node address -> edges that write its output, implicit topics included
	for _, e := range p.Edges {
		if e.Kind == flow.EdgeWrites {
			writes[e.From]++
		}
	}
	for _, e := range g.Edges {
		ve := &viewEdge{from: e.From, to: e.To, kind: string(e.Kind), label: e.Label, topic: e.Topic, implicit: e.Implicit}
		switch e.Kind {
		case flow.EdgeReads:
			ve.counted, ve.reader = byID[e.To].name, byID[e.To].name
		case flow.EdgeWrites:
			if writes[e.From] == 1 { // a route stage's outputs share its count
				ve.counted = byID[e.From].name
			}
		default:
			ve.counted = byID[e.From].name
		}
		v.edges = append(v.edges, ve)
	}

	v.assignLayers(byID)
	v.place(byID)
	v.route(byID)
	return v
}

// assignLayers puts each node one layer after the deepest node that feeds it. Only dead-letter
// edges can close a loop (a stage that repairs dead letters and feeds them back). A depth-first walk
// from the nodes without inputs finds the edges that go back along such a loop; they do not count,
// so that the loop is drawn with the flow left to right and one edge going back.
func (v *graphView) assignLayers(byID map[string]*viewNode) {
	outs := map[*viewNode][]int{} // edges by source, in order
	indeg := map[*viewNode]int{}
	for i, e := range v.edges {
		outs[byID[e.from]] = append(outs[byID[e.from]], i)
		indeg[byID[e.to]]++
	}
	const (
		unvisited = iota
		onPath
		done
	)
	state := map[*viewNode]int{}
	back := make([]bool, len(v.edges))
	var visit func(n *viewNode)
	visit = func(n *viewNode) {
		state[n] = onPath
		for _, i := range outs[n] {
			switch m := byID[v.edges[i].to]; state[m] {
			case unvisited:
				visit(m)
			case onPath:
				back[i] = true
			}
		}
		state[n] = done
	}
	for _, roots := range []bool{true, false} {
		for _, n := range v.nodes {
			if state[n] == unvisited && (!roots || indeg[n] == 0) {
				visit(n)
			}
		}
	}

	// Longest paths over the edges left, in topological order.
	for i, e := range v.edges {
		if back[i] {
			indeg[byID[e.to]]--
		}
	}
	var queue []*viewNode
	for _, n := range v.nodes {
		if indeg[n] == 0 {
			queue = append(queue, n)
		}
	}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, i := range outs[n] {
			if back[i] {
				continue
			}
			to := byID[v.edges[i].to]
			to.layer = max(to.layer, n.layer+1)
			if indeg[to]--; indeg[to] == 0 {
				queue = append(queue, to)
			}
		}
	}
}

// place orders the nodes within each layer to keep edges short and uncrossed (by the mean position
// of their neighbours in the layers before, then after), and gives each node its box.
func (v *graphView) place(byID map[string]*viewNode) {
	var layers [][]*viewNode
	for _, n := range v.nodes {
		for len(layers) <= n.layer {
			layers = append(layers, nil)
		}
		layers[n.layer] = append(layers[n.layer], n)
		n.width, n.height = drawNodeWidth, drawNodeHeight
		if n.typ == "topic" {
			rows := 1
			if n.partitions <= drawMaxCells {
				rows = (n.partitions + drawCellsPerRow - 1) / drawCellsPerRow
			}
			n.height = drawTopicTop + rows*drawTopicRow + 10
		}
	}
	number := func(layer []*viewNode) {
		for i, n := range layer {
			n.order = (float64(i) + 0.5) / float64(len(layer))
		}
	}
	for _, l := range layers {
		number(l)
	}
	// sweep sorts a layer by the mean position of each node's neighbours in the layers before it
	// (or after it); a node without such neighbours keeps its place.
	sweep := func(l int, before bool) {
		key := map[*viewNode]float64{}
		for _, n := range layers[l] {
			sum, count := 0.0, 0
			for _, e := range v.edges {
				self, other := byID[e.to], byID[e.from]
				if !before {
					self, other = other, self
				}
				if self == n && (before && other.layer < l || !before && other.layer > l) {
					sum, count = sum+other.order, count+1
				}
			}
			key[n] = n.order
			if count > 0 {
				key[n] = sum / float64(count)
			}
		}
		sort.SliceStable(layers[l], func(i, j int) bool { return key[layers[l][i]] < key[layers[l][j]] })
		number(layers[l])
	}
	for l := 1; l < len(layers); l++ {
		sweep(l, true)
	}
	for l := len(layers) - 2; l >= 0; l-- {
		sweep(l, false)
	}

	tallest := 0
	heights := make([]int, len(layers))
	for l, layer := range layers {
		for i, n := range layer {
			if i > 0 {
				heights[l] += drawRowGap
			}
			heights[l] += n.height
		}
		tallest = max(tallest, heights[l])
	}
	for l, layer := range layers {
		y := drawMargin + (tallest-heights[l])/2
		for _, n := range layer {
			n.x, n.y = drawMargin+l*(drawNodeWidth+drawLayerGap), y
			y += n.height + drawRowGap
		}
	}
	v.width = 2*drawMargin + len(layers)*drawNodeWidth + max(0, len(layers)-1)*drawLayerGap
	v.height = 2*drawMargin + tallest
}

// route draws each edge. One between neighbouring layers goes straight from the right side of its
// source's box to the left side of its target's. One that skips layers (or goes back, in a
// dead-letter loop) would cross the boxes between: it leaves into the gap after its source, runs
// along a lane of its own below every box, and comes up in the gap before its target.
func (v *graphView) route(byID map[string]*viewNode) {
	lane := v.height - drawMargin + drawLaneGap/2
	for _, e := range v.edges {
		a, b := byID[e.from], byID[e.to]
		start := [2]int{a.x + a.width, a.y + a.height/2}
		end := [2]int{b.x, b.y + b.height/2}
		if b.layer == a.layer+1 {
			e.points = [][2]int{start, end}
			e.labelAt = [2]int{(start[0] + end[0]) / 2, (start[1] + end[1]) / 2}
			continue
		}
		out, in := start[0]+drawLaneTurn, end[0]-drawLaneTurn
		e.points = [][2]int{start, {out, start[1]}, {out, lane}, {in, lane}, {in, end[1]}, end}
		e.labelAt = [2]int{(out + in) / 2, lane}
		lane += drawLaneGap
	}
	v.height = max(v.height, lane-drawLaneGap/2+drawMargin)
}
