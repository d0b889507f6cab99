package web

import (
	"slices"
	"sort"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// graphView is the drawing of a plan: sources, declared topics, stages and sinks placed in layers by
// their depth, left to right. A stage read as stage.NAME writes an implicit topic, which is drawn
// as edges straight from the stage to its readers, as flowrun graph draws it.
type graphView struct {
	nodes         []*viewNode
	edges         []*viewEdge
	width, height int

	// layers are the nodes by layer, in order; perBand is how many layers each band holds, and
	// bandTop and bandBottom where each band's boxes begin and end (its lanes are below).
	layers              [][]*viewNode
	perBand             int
	bandTop, bandBottom []int
}

type viewNode struct {
	id, typ, name, kind, detail string
	deadLetterTopic, key        string
	partitions                  int
	stateful                    bool // a stage whose kind keeps state: it shows dropped, absorbed, late and duplicate counts, and its watermark
	layer, x, y, width, height  int
	order                       float64 // position within the layer, while ordering
}

type viewEdge struct {
	from, to, kind, label, topic string
	implicit                     bool
	fused                        bool     // inside a fused chain: in memory, no stream
	counted                      string   // the node whose counter gives the rate; "" when none does
	count                        string   // that counter: countIn, countOut, ...
	less                         []string // for an output edge, its stage's side outputs' counters, which its count includes
	reader                       string   // the node whose input partitions the edge shows
	points                       [][2]int
	labelAt                      [2]int
}

// The counters an edge's rate may come from (runtime.NodeRate's).
const (
	countIn           = "in"
	countOut          = "out"
	countDeadLettered = "dead_lettered"
	countLate         = "late"
	countDuplicates   = "duplicates"
)

// sideCounters gives, by attribute, the counter of the side outputs whose every message it counts:
// an aggregate counts each late event (and with late = topic.NAME writes each there), a dedupe each
// duplicate. A side output of another kind has none: its rate is unknown.
var sideCounters = map[string]string{"late": countLate, "duplicates": countDuplicates}

// The drawing's measures, in pixels. The page lays out a node's lines inside the box it is given:
// a title and a detail line, then three rows of counters and a dead-letter line for sources, stages
// and sinks (with a line of dropped, absorbed, late and duplicate counts and one of the watermark
// before it for stateful stages), the latest dead letter's reason and two sparklines (the rate and
// the input's lag); or rows of four partitions for topics.
const (
	drawMargin      = 24
	drawNodeWidth   = 240
	drawLayerGap    = 110 // room for the edges' labels between layers
	drawRowGap      = 20
	drawNodeHeight  = 174
	drawStateLine   = 18 // a stateful stage's line of counts, and its line of the watermark
	drawTopicTop    = 48 // a topic's title and detail
	drawTopicRow    = 18
	drawCellsPerRow = 4
	drawMaxCells    = 32 // more partitions are summed up in one line
	drawLaneGap     = 40 // between the lanes of edges that skip layers
	drawLaneTurn    = 14 // how far from a box such an edge turns to its lane
	drawBandGap     = 40 // between a band's last lane and the next band
)

// The drawing is made to fit a landscape screen: the page scales it to the window, and a long
// pipeline drawn on one row would be scaled down until nothing could be read. Its layers are cut
// into bands, one below the other, as many as make the drawing largest once scaled to fitWidth by
// fitHeight (about what a 1280x800 window leaves for it).
const (
	fitWidth  = 1260
	fitHeight = 700
)

// newGraphView lays out the plan's graph (flow's Plan.Graph, which flowrun graph draws too).
func newGraphView(p *flow.Plan) graphView {
	var v graphView
	g := p.Graph()
	stateful := map[string]bool{} // a repartition stage keeps only a watermark: it finds nothing late
	for _, s := range p.Stages {
		if k, err := stages.StageKindOf(s); err == nil && k.TraitsFor(s.Config).Stateful && s.Kind != flow.RepartitionKind {
			stateful["stage."+s.Name] = true
		}
	}
	byID := map[string]*viewNode{}
	for _, n := range g.Nodes {
		detail := n.Detail
		if n.Chain != "" {
			detail += " · fused" // its chain runs in one hop (flow.Chain); the edges inside it say so
		}
		vn := &viewNode{id: n.ID, typ: n.Type, name: n.Name, kind: n.Kind, detail: detail,
			deadLetterTopic: n.DeadLetterTopic, key: n.Key, partitions: n.Partitions, stateful: stateful[n.ID]}
		v.nodes = append(v.nodes, vn)
		byID[vn.id] = vn
	}
	writes := map[string]int{}     // node address -> edges that write its output, implicit topics included
	sides := map[string][]string{} // node address -> the counters of its side outputs ("" for one without)
	for _, e := range p.Edges {
		switch e.Kind {
		case flow.EdgeWrites:
			writes[e.From]++
		case flow.EdgeSideOutput:
			sides[e.From] = append(sides[e.From], sideCounters[e.Label])
		}
	}
	for _, e := range g.Edges {
		ve := &viewEdge{from: e.From, to: e.To, kind: string(e.Kind), label: e.Label, topic: e.Topic, implicit: e.Implicit, fused: e.Fused}
		switch e.Kind {
		case flow.EdgeReads:
			ve.counted, ve.reader, ve.count = byID[e.To].name, byID[e.To].name, countIn
		case flow.EdgeWrites:
			// A route stage's outputs share its count; a stage's written count includes its side
			// outputs, which must each have a counter to take away.
			if writes[e.From] == 1 && !slices.Contains(sides[e.From], "") {
				ve.counted, ve.count, ve.less = byID[e.From].name, countOut, sides[e.From]
			}
		case flow.EdgeSideOutput:
			if c := sideCounters[e.Label]; c != "" {
				ve.counted, ve.count = byID[e.From].name, c
			}
		case flow.EdgeLookup:
			// No message passes: the lookup stage reads the table's rows. Nothing to count.
		default:
			ve.counted, ve.count = byID[e.From].name, countDeadLettered
		}
		v.edges = append(v.edges, ve)
	}

	v.assignLayers(byID)
	v.place(byID)
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
// of their neighbours in the layers before, then after), cuts the layers into bands, and gives each
// node its box and each edge its line.
func (v *graphView) place(byID map[string]*viewNode) {
	var layers [][]*viewNode
	for _, n := range v.nodes {
		for len(layers) <= n.layer {
			layers = append(layers, nil)
		}
		layers[n.layer] = append(layers[n.layer], n)
		n.width, n.height = drawNodeWidth, drawNodeHeight
		if n.stateful {
			n.height += 2 * drawStateLine
		}
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

	v.layers = layers
	best, bestScale := 1, 0.0
	for bands := 1; bands <= len(layers); bands++ {
		v.arrange(byID, bands)
		scale := min(1, float64(fitWidth)/float64(v.width), float64(fitHeight)/float64(v.height))
		if scale > bestScale+0.001 {
			best, bestScale = bands, scale
		}
	}
	v.arrange(byID, best)
}

// arrange places the layers in bands of perLayer layers each, left to right, one band below the
// other, and routes the edges.
func (v *graphView) arrange(byID map[string]*viewNode, bands int) {
	layers := v.layers
	perBand := (len(layers) + bands - 1) / max(1, bands)
	v.perBand = max(1, perBand)
	heights := make([]int, len(layers))
	tallest := make([]int, bands) // of each band
	for l, layer := range layers {
		for i, n := range layer {
			if i > 0 {
				heights[l] += drawRowGap
			}
			heights[l] += n.height
		}
		tallest[l/v.perBand] = max(tallest[l/v.perBand], heights[l])
	}
	// Each band's lanes: the edges that do not go to the next layer of their own band run along a
	// lane below the band of their source.
	lanes := make([]int, bands)
	for _, e := range v.edges {
		if a, b := byID[e.from], byID[e.to]; !v.adjacent(a, b) {
			lanes[a.layer/v.perBand]++
		}
	}
	v.bandTop = make([]int, bands)
	y := drawMargin
	for b := range bands {
		v.bandTop[b] = y
		y += tallest[b]
		if lanes[b] > 0 {
			y += lanes[b] * drawLaneGap
		}
		if b < bands-1 {
			y += drawBandGap
		}
	}
	v.height = y + drawMargin
	v.bandBottom = make([]int, bands)
	for b := range bands {
		v.bandBottom[b] = v.bandTop[b] + tallest[b]
	}
	for l, layer := range layers {
		b := l / v.perBand
		y := v.bandTop[b] + (tallest[b]-heights[l])/2
		for _, n := range layer {
			n.x, n.y = drawMargin+(l%v.perBand)*(drawNodeWidth+drawLayerGap), y
			y += n.height + drawRowGap
		}
	}
	columns := min(len(layers), v.perBand)
	v.width = 2*drawMargin + columns*drawNodeWidth + max(0, columns-1)*drawLayerGap
	v.route(byID)
}

// adjacent says whether an edge from a to b goes to the next layer in the same band.
func (v *graphView) adjacent(a, b *viewNode) bool {
	return b.layer == a.layer+1 && b.layer/v.perBand == a.layer/v.perBand
}

// route draws each edge. One to the next layer of its band goes straight from the right side of its
// source's box to the left side of its target's. Any other (one that skips layers, goes on to the
// next band, or goes back in a dead-letter loop) would cross boxes: it leaves into the gap after
// its source, runs along a lane of its own below its source's band, and goes up or down the gap
// before its target, where there are no boxes.
func (v *graphView) route(byID map[string]*viewNode) {
	next := make([]int, len(v.bandTop)) // each band's next lane
	for b := range next {
		next[b] = v.bandBottom[b] + drawLaneGap/2
	}
	for _, e := range v.edges {
		a, b := byID[e.from], byID[e.to]
		start := [2]int{a.x + a.width, a.y + a.height/2}
		end := [2]int{b.x, b.y + b.height/2}
		if v.adjacent(a, b) {
			e.points = [][2]int{start, end}
			e.labelAt = [2]int{(start[0] + end[0]) / 2, (start[1] + end[1]) / 2}
			continue
		}
		band := a.layer / v.perBand
		lane := next[band]
		next[band] += drawLaneGap
		out, in := start[0]+drawLaneTurn, end[0]-drawLaneTurn
		e.points = [][2]int{start, {out, start[1]}, {out, lane}, {in, lane}, {in, end[1]}, end}
		e.labelAt = [2]int{(out + in) / 2, lane}
	}
}
