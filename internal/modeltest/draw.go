package modeltest

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Draw is one drawn case: a pipeline, the input of each of its sources, and how to run it.
type Draw struct {
	Seed     uint64
	Pipeline *Pipeline
	// Inputs are the lines of each source, in the order it writes them. Some messages are copies of
	// others (same id, same payload), a little later: what a producer that retried sends.
	Inputs [][]Message
	// Disorder is how far, at most, a message's event time lies behind the latest one its source
	// wrote before it. Every grace of an aggregate over the input is at least this, so that nothing
	// is late.
	Disorder time.Duration
	// BatchSize is the most entries one read takes (runtime.Options.BatchSize).
	BatchSize int
	// NoFusion runs every stage in a hop of its own.
	NoFusion bool
	// KillAt, for a runner that runs flowrun processes: kill a process with SIGKILL once the
	// sources have written these fractions of their input (in increasing order; 1 means after the
	// last line, while the stages still work). Empty: no kill.
	KillAt []float64
	// Second: a second process runs beside the first, sharing the partitions.
	Second bool
}

// New draws the case of a seed; the same seed always draws the same case.
func New(seed uint64) *Draw {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	d := &Draw{Seed: seed}
	withAt := r.IntN(3) == 0
	d.drawInputs(r, withAt)
	g := &generator{r: r, d: d, names: map[string]int{}}
	g.eventTimes = []*Expr{fieldTime("ts")}
	if withAt {
		g.eventTimes = append(g.eventTimes, rfc3339Time("msg.at", "at"))
	}
	d.Pipeline = g.draw()
	d.BatchSize = []int{1, 3, 17, 64, 256, 1000}[r.IntN(6)]
	d.NoFusion = r.IntN(3) == 0
	if r.IntN(2) == 0 {
		kills := 1 + r.IntN(3)
		for i := 0; i < kills; i++ {
			d.KillAt = append(d.KillAt, []float64{0.05, 0.2, 0.4, 0.6, 0.8, 1}[r.IntN(6)])
		}
		slices.Sort(d.KillAt)
		d.KillAt = slices.Compact(d.KillAt)
	}
	d.Second = r.IntN(2) == 0
	// Drawn from a generator of its own, so that every seed draws the rest of its case as it did
	// before offloading was drawn (seeds in old reports replay the same pipeline).
	if mix(seed^0x6f66666c6f6164)%3 == 0 {
		d.Pipeline.OffloadOver = "64B"
	}
	return d
}

// mix is splitmix64's finalizer: a well-spread function of a seed, for draws that must not take
// from the case's generator.
func mix(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// Lines is the number of lines all the sources write.
func (d *Draw) Lines() int {
	n := 0
	for _, in := range d.Inputs {
		n += len(in)
	}
	return n
}

// String sums the draw up in a line.
func (d *Draw) String() string {
	var kinds []string
	for _, s := range d.Pipeline.Stages {
		k := s.Kind
		if s.Kind == "aggregate" {
			k += "/" + s.Window.Type
		}
		kinds = append(kinds, k)
	}
	s := fmt.Sprintf("seed %d: %d lines from %d sources, disorder %s, stages %s, %s, batch %d, fusion %v",
		d.Seed, d.Lines(), len(d.Inputs), d.Disorder, strings.Join(kinds, " "), d.Pipeline.Delivery, d.BatchSize, !d.NoFusion)
	if o := d.Pipeline.OffloadOver; o != "" {
		s += ", payloads over " + o + " offloaded"
	}
	return s
}

// drawInputs draws the events: ids e0, e1, ..., users, regions and values at random, event times
// that mostly increase with some going back (never to a time another event has), and copies.
func (d *Draw) drawInputs(r *rand.Rand, withAt bool) {
	n := 50 + r.IntN(450)
	step := int64(1 + r.IntN(30))
	back := []int64{0, 0, 40, 300, 1000, 2500}[r.IntN(6)]
	users := 2 + r.IntN(12)
	base := int64(1_700_000_000_000) + r.Int64N(600_000)
	regions := []string{"eu", "us", "apac", "latam"}
	copies := []float64{0, 0.05, 0.2}[r.IntN(3)]

	type placed struct {
		pos float64
		msg Message
	}
	var all []placed
	used := map[int64]bool{}
	for i := 0; i < n; i++ {
		ts := base + int64(i)*step - r.Int64N(back+1)
		for used[ts] {
			ts++
		}
		used[ts] = true
		m := Message{
			"id":     "e" + strconv.Itoa(i),
			"user":   "u" + strconv.Itoa(r.IntN(users)),
			"region": regions[r.IntN(len(regions))],
			"v":      float64(r.IntN(100)),
			"ts":     float64(ts),
			"note":   "n" + strconv.Itoa(r.IntN(3)),
		}
		if withAt {
			m["at"] = formatTime(ts)
		}
		all = append(all, placed{float64(i), m})
		if r.Float64() < copies {
			all = append(all, placed{float64(i) + 0.5 + float64(r.IntN(8)), m})
		}
	}
	slices.SortStableFunc(all, func(a, b placed) int {
		switch {
		case a.pos < b.pos:
			return -1
		case a.pos > b.pos:
			return 1
		}
		return 0
	})
	sources := 1 + r.IntN(2)
	d.Inputs = make([][]Message, sources)
	for _, p := range all {
		i := r.IntN(sources)
		d.Inputs[i] = append(d.Inputs[i], p.msg)
	}
	for _, in := range d.Inputs {
		latest := int64(0)
		for _, m := range in {
			ts := int64(m["ts"].(float64))
			if latest > ts {
				d.Disorder = max(d.Disorder, time.Duration(latest-ts)*time.Millisecond)
			}
			latest = max(latest, ts)
		}
	}
}

// generator draws a pipeline.
type generator struct {
	r          *rand.Rand
	d          *Draw
	p          *Pipeline
	names      map[string]int
	stagesLeft int
	eventTimes []*Expr // the event times an input's stateful stage may read: msg.ts, and msg.at
	// shareable are the declared topics of events that stages write and others may write too (not
	// late or duplicates routes, whose sinks look for those alone).
	shareable []*Topic
	events    *Topic // the topic the sources write
	// held, while what reads a lookup as_of is drawn, is its as_of: the event time that every
	// stateful stage after it reads (the lookup holds back only that one, flow.Kind.Delays).
	held *Expr
}

// eventTime draws the event time a stateful stage reads: the one a lookup as_of before it holds.
func (g *generator) eventTime() *Expr {
	if g.held != nil {
		return g.held
	}
	return g.eventTimes[g.r.IntN(len(g.eventTimes))]
}

// stream is what a stage or sink can read: events (level 0) or the results of an aggregate of
// level-1 streams (level 1 reads events, level 2 results).
type stream struct {
	ref   Ref
	level int
}

func (g *generator) name(prefix string) string {
	g.names[prefix]++
	return prefix + strconv.Itoa(g.names[prefix])
}

// draw draws pipelines until one has a stateful stage.
func (g *generator) draw() *Pipeline {
	for {
		g.p, g.names, g.shareable = &Pipeline{Delivery: []string{"at_least_once", "effectively_once"}[g.r.IntN(2)]}, map[string]int{}, nil
		in := g.topic(0)
		g.events = in
		for i := range g.d.Inputs {
			g.p.Sources = append(g.p.Sources, &Source{Name: g.name("src"), Output: in, Input: i})
		}
		g.stagesLeft = 2 + g.r.IntN(6)
		g.extend(stream{Ref{Topic: in}, 0}, 0)
		for _, s := range g.p.Stages {
			if s.Kind == "aggregate" || s.Kind == "dedupe" || s.Kind == "pattern" || s.Kind == "join" {
				return g.p
			}
		}
	}
}

// extend draws what reads s: one reader, or two (a fan-out).
func (g *generator) extend(s stream, depth int) {
	readers := 1
	if g.stagesLeft > 1 && g.r.IntN(10) < 3 {
		readers = 2
	}
	for i := 0; i < readers; i++ {
		g.reader(s, depth)
	}
}

// reader draws one reader of s: a sink or a stage, and what reads the stage in turn.
func (g *generator) reader(s stream, depth int) {
	if g.stagesLeft <= 0 || s.level >= 2 && g.r.IntN(10) < 7 || depth > 0 && g.r.IntN(10) == 0 {
		g.sink(s.ref)
		return
	}
	g.stagesLeft--
	st := &Stage{Name: g.name("st"), Input: s.ref}
	kinds := []string{"filter", "filter", "map", "map", "route", "dedupe", "dedupe", "aggregate", "aggregate", "aggregate", "lookup", "rate_limit"}
	if s.level > 0 {
		kinds = []string{"filter", "map", "aggregate", "aggregate"}
	}
	if s.level >= 2 {
		kinds = []string{"filter"}
	}
	if s.level == 0 && g.p.Delivery == "effectively_once" {
		// A message delivered twice may take a step in the place of the next one: a pattern's
		// results are exact under effectively-once only.
		kinds = append(kinds, "pattern", "pattern")
	}
	if s.level == 0 && g.stagesLeft > 0 {
		kinds = append(kinds, "join", "join")
	}
	st.Kind = kinds[g.r.IntN(len(kinds))]
	g.p.Stages = append(g.p.Stages, st)
	switch st.Kind {
	case "filter":
		st.Where = g.condition(s.level)
		g.passOn(st, s.level, depth)
	case "map":
		st.Set, st.Drop = g.change(s.level)
		g.passOn(st, s.level, depth)
	case "route":
		for i, cases := 0, 1+g.r.IntN(2); i < cases; i++ {
			st.Cases = append(st.Cases, Case{When: g.condition(0), Output: g.topic(0)})
			g.share(st.Cases[i].Output)
		}
		if g.r.IntN(2) == 0 {
			st.Default = g.topic(0)
			g.share(st.Default)
		}
		for _, c := range st.Cases {
			g.extend(stream{Ref{Topic: c.Output}, 0}, depth+1)
		}
		if st.Default != nil {
			g.extend(stream{Ref{Topic: st.Default}, 0}, depth+1)
		}
	case "dedupe":
		st.Key = field("id")
		st.EventTime = g.eventTime()
		// Long enough that a copy, which comes at most Disorder behind what came before it, finds
		// its first still remembered; sometimes just so, so that keys are forgotten on the way.
		st.Within = []time.Duration{g.d.Disorder + time.Millisecond + time.Duration(g.r.IntN(2000))*time.Millisecond, time.Hour}[g.r.IntN(2)]
		if g.r.IntN(3) == 0 {
			st.Duplicates = g.topic(0)
			g.sink(Ref{Topic: st.Duplicates})
		}
		g.passOn(st, 0, depth)
	case "aggregate":
		g.aggregate(st, s.level)
		g.passOn(st, s.level+1, depth)
	case "pattern":
		g.pattern(st)
		g.sink(Ref{Stage: st}) // its results are no events for the stages drawn after
	case "join":
		g.join(st)
		g.sink(Ref{Stage: st})
	case "rate_limit":
		// A limit that binds for a moment (a few hundred events of a key at up to 5,000 a
		// second): messages wait, in place, and none is lost or reordered.
		st.Key = []*Expr{nil, field("user"), field("region")}[g.r.IntN(3)]
		st.Rate, st.Burst = 500+g.r.IntN(4500), 1+g.r.IntN(100)
		g.passOn(st, 0, depth)
	case "lookup":
		g.lookup(st)
		held := g.held
		if st.AsOf != nil {
			g.held = st.AsOf
		}
		g.passOn(st, 0, depth)
		g.held = held
	}
}

// join draws a join of the stream it reads (its left side) with the events that a filter of its
// own passes (its right side), by id: each event meets its own copies on the other side, and the
// events the filter refuses come out alone from a left or outer join. Each side reads its own event
// time; the span is drawn, and a grace that keeps every event on time.
func (g *generator) join(st *Stage) {
	g.stagesLeft--
	right := &Stage{Name: g.name("st"), Kind: "filter", Input: Ref{Topic: g.events}, Where: g.condition(0)}
	g.p.Stages = append(g.p.Stages, right)
	st.Right = Ref{Stage: right}
	st.Key, st.RightKey = field("id"), field("id")
	st.EventTime = g.eventTime()
	st.RightEventTime = g.eventTimes[g.r.IntN(len(g.eventTimes))] // the events' own: not after the lookup
	st.JoinType = []string{"inner", "left", "outer"}[g.r.IntN(3)]
	st.Before = time.Duration(g.r.IntN(3)) * 500 * time.Millisecond
	st.After = time.Duration(g.r.IntN(3)) * 500 * time.Millisecond
	st.Grace = g.d.Disorder.Round(time.Millisecond) + time.Duration(g.r.IntN(3))*250*time.Millisecond
	side := func(side, name string) *Expr {
		return &Expr{HCL: side + "." + name, Eval: func(m Message) any {
			if e, _ := m[side].(Message); e != nil {
				return e[name]
			}
			return nil
		}}
	}
	st.Select = []Field{{"l", side("left", "id")}, {"r", side("right", "id")}, {"lv", side("left", "v")}, {"rv", side("right", "v")}}
}

// lookup draws a lookup of each event's user in the pipeline's table, drawn with its first lookup.
// The row lands at a field of its own (a lookup after a lookup keeps both rows), and a user the
// table does not hold takes any of the three ways of missing. Of a versioned table, most lookups
// take the row as of an event time of the event's.
func (g *generator) lookup(st *Stage) {
	if len(g.p.Tables) == 0 {
		g.table()
	}
	st.Table = g.p.Tables[0]
	st.Key = field("user")
	st.As = g.name("row")
	st.Missing = []string{"null", "drop", "dead_letter"}[g.r.IntN(3)]
	if st.Table.Versioned && g.r.IntN(3) > 0 {
		st.AsOf = g.eventTime()
	}
}

// table draws the pipeline's table (Table): a row for most of the users the events name and for
// a few they do not, in one to three versions, some deleted and some of those written again, the
// users' updates interleaved at random. Its topic is keyed in one of the ways that keep a key's
// updates in one partition, in order: by the messages' keys, by the user (the table keyed like its
// topic, by default or by the same expression), or by a field that is the same in every version of
// a user's row (the table keyed otherwise, through a repartition topic, where a delete, whose null
// payload has no user to read, cannot be).
func (g *generator) table() {
	users := map[string]bool{}
	for _, in := range g.d.Inputs {
		for _, m := range in {
			users[m["user"].(string)] = true
		}
	}
	keys := []string{"x0", "x1"} // keys no event looks up
	for u := range users {
		keys = append(keys, u)
	}
	slices.Sort(keys)
	topic := &Topic{Name: g.name("t"), Partitions: 1 + g.r.IntN(5)}
	t := &Table{Name: g.name("tb"), Input: topic}
	switch g.r.IntN(4) {
	case 0: // the key each update is written with
	case 1:
		topic.Key = field("user")
	case 2:
		topic.Key, t.Key = field("user"), field("user")
	default:
		topic.Key, t.Key = field("home"), field("user")
	}
	t.Versioned = g.r.IntN(2) == 0
	deletes := !t.Versioned && (t.Key == nil || topic.Key != nil && topic.Key.HCL == t.Key.HCL)
	// A versioned table's versions begin before the first event, among the events, or after the
	// last, a key's in increasing order.
	first, last := int64(math.MaxInt64), int64(0)
	for _, in := range g.d.Inputs {
		for _, m := range in {
			ts := int64(num(m["ts"]))
			first, last = min(first, ts), max(last, ts)
		}
	}
	span := last - first + 1
	regions := []string{"eu", "us", "apac", "latam"}
	var queues [][]Update // each key's updates, in order
	for i, k := range keys {
		if users[k] && g.r.IntN(4) == 0 {
			continue // a user without a row
		}
		home := regions[i%len(regions)]
		upd := first - span/4 + g.r.Int64N(span/2+1)
		row := func(version int) Update {
			tier := []string{"gold", "silver", "bronze"}[g.r.IntN(3)]
			r := Message{"user": k, "home": home, "tier": tier, "ver": float64(version)}
			if t.Versioned {
				r["upd"] = float64(upd)
				upd += 1 + g.r.Int64N(span/2+1)
			}
			return Update{Key: k, Row: r}
		}
		var q []Update
		versions := 1 + g.r.IntN(3)
		for v := 1; v <= versions; v++ {
			q = append(q, row(v))
		}
		if deletes && g.r.IntN(3) == 0 {
			q = append(q, Update{Key: k})
			if g.r.IntN(2) == 0 {
				q = append(q, row(versions+1))
			}
		}
		queues = append(queues, q)
	}
	for len(queues) > 0 {
		i := g.r.IntN(len(queues))
		t.Updates = append(t.Updates, queues[i][0])
		if queues[i] = queues[i][1:]; len(queues[i]) == 0 {
			queues = slices.Delete(queues, i, i+1)
		}
	}
	if t.Versioned {
		// In event time, as a table's topic is best written: none is late for the table.
		slices.SortStableFunc(t.Updates, func(a, b Update) int { return cmp.Compare(num(a.Row["upd"]), num(b.Row["upd"])) })
	}
	g.p.Topics = append(g.p.Topics, topic) // not shareable: no stage writes it
	g.p.Tables = append(g.p.Tables, t)
}

// pattern draws a pattern over events: two or three steps per user or region, within a span that
// some sequences fit in and others do not, and a grace that keeps every event on time.
func (g *generator) pattern(st *Stage) {
	st.Key = []*Expr{field("user"), field("region")}[g.r.IntN(2)]
	st.EventTime = g.eventTime()
	st.Grace = g.d.Disorder.Round(time.Millisecond) + time.Duration(g.r.IntN(3))*250*time.Millisecond
	st.Within = time.Duration(50+g.r.IntN(3000)) * time.Millisecond
	for i := range 2 + g.r.IntN(2) {
		st.Steps = append(st.Steps, Step{Name: "s" + strconv.Itoa(i+1), Where: g.condition(0)})
	}
	first, last := st.Steps[0].Name, st.Steps[len(st.Steps)-1].Name
	for _, step := range st.Steps {
		st.Select = append(st.Select, Field{step.Name, stepField(step.Name, "id")})
	}
	st.Select = append(st.Select,
		Field{"key", stepField(first, strings.TrimPrefix(st.Key.HCL, "msg."))},
		Field{"span", &Expr{HCL: fmt.Sprintf("%s.ts - %s.ts", last, first), Eval: func(m Message) any {
			steps := m["steps"].(map[string]Message)
			return num(steps[last]["ts"]) - num(steps[first]["ts"])
		}}})
}

// stepField is STEP.NAME in a pattern's select; its Eval reads a match as the model makes it
// ({"steps": {name: message}}).
func stepField(step, name string) *Expr {
	return &Expr{HCL: step + "." + name, Eval: func(m Message) any { return m["steps"].(map[string]Message)[step][name] }}
}

// passOn draws where a stage writes (its own output, a new declared topic, or one that another
// stage writes too) and what reads it.
func (g *generator) passOn(st *Stage, level, depth int) {
	switch {
	case g.r.IntN(10) < 6:
		g.extend(stream{Ref{Stage: st}, level}, depth+1)
	case level == 0 && g.held == nil && g.r.IntN(3) == 0 && g.shareTopic(st):
		// Another writer's topic, whose readers are drawn already (or will be). Not after a lookup
		// as_of: they may read another event time than the one it holds back.
	default:
		st.Output = g.topic(level)
		if level == 0 {
			g.share(st.Output)
		}
		g.extend(stream{Ref{Topic: st.Output}, level}, depth+1)
	}
}

// share lets other stages write t too, unless it comes after a lookup as_of: a stateful reader of
// theirs drawn later could read another event time than the one the lookup holds back.
func (g *generator) share(t *Topic) {
	if g.held == nil {
		g.shareable = append(g.shareable, t)
	}
}

// shareTopic makes st write a declared topic of events that another stage already writes, where
// that makes no loop; false when there is none.
func (g *generator) shareTopic(st *Stage) bool {
	var candidates []*Topic
	for _, t := range g.shareable {
		// A dedupe after a topic of two writers keeps whichever copy of an event comes first, and
		// their copies may differ (a map's): no model can say which.
		if !g.reaches(t, st) && !g.feeds(t, func(s *Stage) bool { return s.Kind == "dedupe" }) {
			candidates = append(candidates, t)
		}
	}
	if len(candidates) == 0 {
		return false
	}
	st.Output = candidates[g.r.IntN(len(candidates))]
	return true
}

// writtenBy lists the declared topics a stage writes messages it read to.
func writtenBy(s *Stage) []*Topic {
	out := []*Topic{s.Output}
	for _, c := range s.Cases {
		out = append(out, c.Output)
	}
	return append(out, s.Default)
}

// reaches reports whether what reads topic t leads, through any number of stages, to stage to.
func (g *generator) reaches(t *Topic, to *Stage) bool {
	return to.Input == Ref{Topic: t} || g.feeds(t, func(s *Stage) bool { return s == to })
}

// feeds reports whether a stage that match accepts reads t, or what was made of t on the way.
func (g *generator) feeds(t *Topic, match func(*Stage) bool) bool {
	seen := map[*Stage]bool{}
	var from func(r Ref) bool
	from = func(r Ref) bool {
		for _, s := range g.p.Stages {
			if seen[s] || s.Input != r {
				continue
			}
			seen[s] = true
			if match(s) || from(Ref{Stage: s}) {
				return true
			}
			for _, o := range append(writtenBy(s), s.LateTopic, s.Duplicates) {
				if o != nil && from(Ref{Topic: o}) {
					return true
				}
			}
		}
		return false
	}
	return from(Ref{Topic: t})
}

// topic draws a declared topic of events (level 0) or results.
func (g *generator) topic(level int) *Topic {
	t := &Topic{Name: g.name("t"), Partitions: 1 + g.r.IntN(5)}
	keys := []*Expr{nil, field("user"), field("id"), field("region"), {
		HCL:  `"${msg.v % 4}"`,
		Eval: func(m Message) any { return formatNumber(mod(num(m["v"]), 4)) },
	}}
	if level > 0 {
		keys = []*Expr{nil, field("key"), {HCL: "msg.window.start", Eval: func(m Message) any { return m["window"].(map[string]any)["start"] }}}
	}
	t.Key = keys[g.r.IntN(len(keys))]
	g.p.Topics = append(g.p.Topics, t)
	return t
}

func (g *generator) sink(r Ref) {
	g.p.Sinks = append(g.p.Sinks, &Sink{Name: g.name("out"), Input: r})
}

// condition draws a filter's or a route case's condition.
func (g *generator) condition(level int) *Expr {
	if level > 0 {
		n := 1 + g.r.IntN(3)
		return &Expr{HCL: fmt.Sprintf("msg.n >= %d", n), Eval: func(m Message) any { return num(m["n"]) >= float64(n) }}
	}
	switch g.r.IntN(4) {
	case 0:
		k := 2 + g.r.IntN(4)
		rest := g.r.IntN(k)
		return &Expr{HCL: fmt.Sprintf("msg.v %% %d != %d", k, rest), Eval: func(m Message) any { return mod(num(m["v"]), float64(k)) != float64(rest) }}
	case 1:
		least := g.r.IntN(100)
		return &Expr{HCL: fmt.Sprintf("msg.v >= %d", least), Eval: func(m Message) any { return num(m["v"]) >= float64(least) }}
	case 2:
		region := []string{"eu", "us", "apac"}[g.r.IntN(3)]
		return &Expr{HCL: fmt.Sprintf("msg.region == %q", region), Eval: func(m Message) any { return m["region"] == region }}
	default:
		return &Expr{HCL: `msg.user != "u0"`, Eval: func(m Message) any { return m["user"] != "u0" }}
	}
}

// change draws what a map does: one change, so that no field it sets depends on another it sets.
// It never touches an event time (ts, at, window), which the compiler refuses.
func (g *generator) change(level int) ([]Field, []string) {
	if level > 0 {
		return []Field{{g.name("big"), &Expr{HCL: "msg.n >= 2", Eval: func(m Message) any { return num(m["n"]) >= 2 }}}}, nil
	}
	switch g.r.IntN(5) {
	case 0:
		return []Field{{"v", &Expr{HCL: "msg.v * 2 + 1", Eval: func(m Message) any { return num(m["v"])*2 + 1 }}}}, nil
	case 1:
		return []Field{{g.name("w"), &Expr{HCL: "msg.v % 7", Eval: func(m Message) any { return mod(num(m["v"]), 7) }}}}, nil
	case 2:
		return []Field{{"region", &Expr{HCL: "upper(msg.region)", Eval: func(m Message) any { return strings.ToUpper(m["region"].(string)) }}}}, nil
	case 3:
		return []Field{{g.name("tag"), &Expr{HCL: `"${msg.user}-${msg.region}"`, Eval: func(m Message) any {
			return m["user"].(string) + "-" + m["region"].(string)
		}}}}, nil
	default:
		return nil, []string{"note"}
	}
}

// aggregate draws an aggregate over a stream of the given level.
func (g *generator) aggregate(st *Stage, level int) {
	st.Aggregates = []Aggregate{{Name: "n", Func: "count"}}
	if level == 0 {
		st.EventTime = g.eventTime()
		st.GroupBy = []*Expr{field("user"), field("region"), constant("all"), {
			HCL: `"${msg.region}/${msg.v % 2}"`,
			Eval: func(m Message) any {
				return m["region"].(string) + "/" + formatNumber(mod(num(m["v"]), 2))
			},
		}}[g.r.IntN(4)]
		// The least grace that keeps everything on time, or a little more.
		st.Grace = g.d.Disorder.Round(time.Millisecond) + time.Duration(g.r.IntN(3))*250*time.Millisecond
		more := []Aggregate{
			{Name: "s", Func: "sum", Arg: field("v")},
			{Name: "lo", Func: "min", Arg: field("v")},
			{Name: "hi", Func: "max", Arg: field("v")},
			{Name: "mean", Func: "avg", Arg: field("v")},
			{Name: "users", Func: "count_distinct", Arg: field("user")},
			{Name: "first_id", Func: "first", Arg: field("id")},
			{Name: "last_id", Func: "last", Arg: field("id")},
			{Name: "top", Func: "top_k", Arg: field("region"), K: 2},
			{Name: "top_user", Func: "max_by", Arg: field("user"), By: field("v")},
			{Name: "low_id", Func: "min_by", Arg: field("id"), By: field("v")},
		}
		for _, a := range more {
			if g.r.IntN(3) == 0 {
				st.Aggregates = append(st.Aggregates, a)
			}
		}
	} else {
		if g.r.IntN(2) == 0 {
			st.EventTime = rfc3339Time("msg.window.start", "window", "start")
		}
		st.GroupBy = []*Expr{constant("all"), field("key")}[g.r.IntN(2)]
		st.Grace = time.Duration(g.r.IntN(3)) * 500 * time.Millisecond
		st.Aggregates = append(st.Aggregates,
			Aggregate{Name: "total", Func: "sum", Arg: field("n")},
			Aggregate{Name: "most", Func: "max", Arg: field("n")},
			Aggregate{Name: "keys", Func: "count_distinct", Arg: field("key")},
			Aggregate{Name: "busiest", Func: "max_by", Arg: field("key"), By: field("n")})
	}
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+g.r.IntN(hi-lo+1)) * time.Millisecond }
	switch g.r.IntN(3) {
	case 0:
		st.Window = Window{Type: "tumbling", Size: ms(2, 40) * 250}
	case 1:
		advance := ms(1, 12) * 250
		st.Window = Window{Type: "hopping", Advance: advance, Size: advance * time.Duration(2+g.r.IntN(3))}
	default:
		st.Window = Window{Type: "session", Gap: ms(1, 12) * 250}
	}
	switch g.r.IntN(3) {
	case 0:
		st.Late = "dead_letter"
	case 1:
		st.Late = "drop"
	default:
		st.LateTopic = g.topic(level)
		g.sink(Ref{Topic: st.LateTopic})
	}
}

// field is msg.NAME.
func field(name string) *Expr {
	return &Expr{HCL: "msg." + name, Eval: func(m Message) any { return m[name] }}
}

func constant(s string) *Expr {
	return &Expr{HCL: strconv.Quote(s), Eval: func(Message) any { return s }}
}

// fieldTime is an event time in Unix milliseconds, msg.NAME.
func fieldTime(name string) *Expr {
	return &Expr{HCL: "msg." + name, Eval: func(m Message) any { return int64(num(m[name])) }}
}

// rfc3339Time is an event time written as RFC 3339 text at a path of the message.
func rfc3339Time(hcl string, path ...string) *Expr {
	return &Expr{HCL: hcl, Eval: func(m Message) any {
		var v any = map[string]any(m)
		for _, p := range path {
			v = v.(map[string]any)[p]
		}
		t, err := time.Parse(time.RFC3339Nano, v.(string))
		if err != nil {
			panic(err)
		}
		return t.UnixMilli()
	}}
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func mod(a, b float64) float64 { return float64(int64(a) % int64(b)) }

func formatNumber(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// formatTime is how flowrun writes a time: RFC 3339 in UTC, with as many decimals as it needs.
func formatTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
