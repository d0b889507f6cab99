package flow

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow/expr"
)

// GraphFormats are the formats WriteGraph renders.
var GraphFormats = []string{"dot", "mermaid", "json"}

// WriteGraph renders the plan's graph as Graphviz DOT, a Mermaid flowchart or JSON.
func WriteGraph(w io.Writer, p *Plan, format string) error {
	switch format {
	case "dot":
		return writeDOT(w, p)
	case "mermaid":
		return writeMermaid(w, p)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(p.Describe())
	}
	return fmt.Errorf("unknown graph format %q; the formats are %s", format, strings.Join(GraphFormats, ", "))
}

// Graph is the plan's graph as every drawing of it shows it: flowrun graph's DOT and Mermaid, and
// the live page of a running pipeline (package runtime/web), so that they agree on the nodes, the
// edges and their labels. A stage read as stage.NAME writes an implicit topic, which is no node of
// the graph: it is drawn as edges straight from the stage to each of its readers.
type Graph struct {
	Nodes []GraphNode // sources, declared topics, stages, sinks, each in the plan's order
	Edges []GraphEdge // in the plan's order, each implicit topic's edges where its readers' were
}

// GraphNode is a source, a declared topic, a stage or a sink.
type GraphNode struct {
	ID     string // the address: source.NAME, topic.NAME, stage.NAME or sink.NAME
	Type   string // source, topic, stage or sink
	Name   string
	Kind   string // the source's, stage's or sink's kind; "" for a topic
	Detail string // a short description: "map stage", "go stage: enrich", "4 partitions"
	// Partitions and Key (the key expression, "" without one) are a topic's.
	Partitions int
	Key        string
	// Retry is a stage's or sink's retry policy in words; DeadLetterTopic the topic its dead
	// letters go to, if it names one.
	Retry           string
	DeadLetterTopic string
	// Chain names the fused chain a stage runs in (Chain.Name); "" when it runs in a hop of its own.
	Chain string
}

// Label is the node's label, one line each: its name and detail, then a topic's key or a stage's or
// sink's retry policy.
func (n GraphNode) Label() []string {
	lines := []string{n.Name, n.Detail}
	switch {
	case n.Type == "topic" && n.Key != "":
		lines = append(lines, "key: "+n.Key)
	case n.Type == "stage" || n.Type == "sink":
		lines = append(lines, n.Retry)
	}
	return lines
}

// GraphEdge connects a node with a topic, or, for an implicit topic, the stage that writes it with
// a node that reads it.
type GraphEdge struct {
	From, To string   // addresses
	Kind     EdgeKind // an implicit topic's edges are reads: they stand for its readers' edges
	Label    string   // a route case's condition, "default", a side output's "late"; "" for most edges
	Topic    string   // the name of the topic the edge carries
	Implicit bool     // the edge stands for an implicit topic
	Fused    bool     // the edge is inside a fused chain: its messages pass in memory, not through a stream
}

// Graph returns the plan's graph.
func (p *Plan) Graph() Graph {
	var g Graph
	ids := map[string]bool{}
	add := func(n GraphNode) {
		g.Nodes = append(g.Nodes, n)
		ids[n.ID] = true
	}
	deadLetterName := func(t *Topic) string {
		if t == nil {
			return ""
		}
		return t.Name
	}
	for _, s := range p.Sources {
		add(GraphNode{ID: "source." + s.Name, Type: "source", Name: s.Name, Kind: s.Kind, Detail: s.Kind + " source"})
	}
	for _, t := range p.Topics {
		if t.Implicit {
			continue
		}
		n := GraphNode{ID: "topic." + t.Name, Type: "topic", Name: t.Name, Partitions: t.Partitions,
			Detail: fmt.Sprintf("%d partition%s", t.Partitions, plural(t.Partitions))}
		if t.Key != nil {
			n.Key = t.Key.String()
		}
		add(n)
	}
	for _, s := range p.Stages {
		detail := s.Kind + " stage"
		if s.Spec != nil && s.Spec.Detail != nil {
			detail = s.Spec.Detail(s.Config)
		}
		n := GraphNode{ID: "stage." + s.Name, Type: "stage", Name: s.Name, Kind: s.Kind, Detail: detail,
			Retry: retryLine(s.Retry), DeadLetterTopic: deadLetterName(s.DeadLetter)}
		if s.Chain != nil {
			n.Chain = s.Chain.Name()
		}
		add(n)
	}
	for _, s := range p.Sinks {
		add(GraphNode{ID: "sink." + s.Name, Type: "sink", Name: s.Name, Kind: s.Kind, Detail: s.Kind + " sink",
			Retry: retryLine(s.Retry), DeadLetterTopic: deadLetterName(s.DeadLetter)})
	}

	implicit := map[string]string{} // address -> topic name
	for _, t := range p.Topics {
		if t.Implicit {
			implicit["topic."+t.Name] = t.Name
		}
	}
	writers := map[string][]string{}
	for _, e := range p.Edges {
		if _, ok := implicit[e.To]; ok {
			writers[e.To] = append(writers[e.To], e.From)
		}
	}
	nameOf := func(addr string) string { return addr[strings.IndexByte(addr, '.')+1:] }
	edge := func(e GraphEdge) {
		if ids[e.From] && ids[e.To] {
			g.Edges = append(g.Edges, e)
		}
	}
	for _, e := range p.Edges {
		if _, ok := implicit[e.To]; ok {
			continue
		}
		if topic, ok := implicit[e.From]; ok {
			fused := p.Fused(p.Topic(topic))
			for _, w := range writers[e.From] {
				edge(GraphEdge{From: w, To: e.To, Kind: EdgeReads, Topic: topic, Implicit: true, Fused: fused})
			}
			continue
		}
		topic := nameOf(e.To)
		if e.Kind == EdgeReads {
			topic = nameOf(e.From)
		}
		edge(GraphEdge{From: e.From, To: e.To, Kind: e.Kind, Label: e.Label, Topic: topic})
	}
	for _, s := range p.Stages {
		for _, t := range s.Config.tableRefs() {
			if t.Stage != nil && t.Stage.Input != nil {
				edge(GraphEdge{From: "stage." + t.Stage.Name, To: "stage." + s.Name, Kind: EdgeLookup, Label: "lookup", Topic: t.Stage.Input.Name})
			}
		}
	}
	return g
}

func retryLine(r RetryPolicy) string {
	if r.Name == "" {
		return fmt.Sprintf("retry default: %d attempts, %s; transient failures without limit", r.MaxAttempts, r.Backoff)
	}
	var limit string
	switch {
	case r.MaxAttempts == 1:
		return fmt.Sprintf("retry %s: no retries", r.Name)
	case r.MaxAttempts == 0 && r.MaxElapsed == 0:
		limit = "no limit"
	case r.MaxAttempts == 0:
		limit = "for " + FormatDuration(r.MaxElapsed)
	case r.MaxElapsed == 0:
		limit = fmt.Sprintf("%d attempts", r.MaxAttempts)
	default:
		limit = fmt.Sprintf("%d attempts within %s", r.MaxAttempts, FormatDuration(r.MaxElapsed))
	}
	return fmt.Sprintf("retry %s: %s, %s", r.Name, limit, r.Backoff)
}

func writeDOT(w io.Writer, p *Plan) error {
	var b strings.Builder
	fmt.Fprintf(&b, "digraph %s {\n", dotQuote(p.Name))
	b.WriteString("  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=11];\n  edge [fontname=\"Helvetica\", fontsize=9];\n")
	shapes := map[string]string{
		"source": `shape=invhouse, style=filled, fillcolor="#e8f4ea"`,
		"topic":  `shape=cylinder, style=filled, fillcolor="#eef2fb"`,
		"stage":  `shape=box, style="rounded,filled", fillcolor="#fff7e0"`,
		"sink":   `shape=house, style=filled, fillcolor="#f3e8f4"`,
	}
	g := p.Graph()
	for _, n := range g.Nodes {
		if n.Chain == "" {
			fmt.Fprintf(&b, "  %s [%s, label=%s];\n", dotQuote(n.ID), shapes[n.Type], dotQuote(strings.Join(n.Label(), "\n")))
		}
	}
	for i, c := range p.Chains {
		// A fused chain is one box around its stages: one hop, one consumer group.
		name := c.Name()
		fmt.Fprintf(&b, "  subgraph cluster_fused_%d {\n    label=%s;\n    style=dashed;\n    color=\"#b08d2e\";\n    fontsize=9;\n",
			i, dotQuote("fused: "+name+" (one hop)"))
		for _, n := range g.Nodes {
			if n.Chain == name {
				fmt.Fprintf(&b, "    %s [%s, label=%s];\n", dotQuote(n.ID), shapes[n.Type], dotQuote(strings.Join(n.Label(), "\n")))
			}
		}
		b.WriteString("  }\n")
	}
	for _, e := range g.Edges {
		var attrs []string
		switch {
		case e.Kind == EdgeDeadLetter:
			attrs = append(attrs, `style=dashed`, `color="#c0392b"`, `fontcolor="#c0392b"`, `label="dead letters"`)
		case e.Kind == EdgeSideOutput:
			attrs = append(attrs, `style=dashed`, `color="#7d3c98"`, `fontcolor="#7d3c98"`, "label="+dotQuote(e.Label))
		case e.Kind == EdgeLookup:
			attrs = append(attrs, `style=dotted`, `label="lookup"`)
		case e.Fused:
			attrs = append(attrs, `label="in memory"`)
		case e.Label != "":
			attrs = append(attrs, "label="+dotQuote(e.Label))
		}
		suffix := ""
		if len(attrs) > 0 {
			suffix = " [" + strings.Join(attrs, ", ") + "]"
		}
		fmt.Fprintf(&b, "  %s -> %s%s;\n", dotQuote(e.From), dotQuote(e.To), suffix)
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// dotQuote quotes a DOT identifier or label; "\n" becomes a line break.
func dotQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

func writeMermaid(w io.Writer, p *Plan) error {
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	open := map[string]string{"source": `[/`, "topic": `[(`, "stage": `(`, "sink": `[[`}
	closing := map[string]string{"source": `/]`, "topic": `)]`, "stage": `)`, "sink": `]]`}
	g := p.Graph()
	node := func(indent string, n GraphNode) {
		fmt.Fprintf(&b, "%s%s%s%s%s\n", indent, mermaidID(n.ID), open[n.Type], mermaidQuote(strings.Join(n.Label(), "<br/>")), closing[n.Type])
	}
	for _, n := range g.Nodes {
		if n.Chain == "" {
			node("  ", n)
		}
	}
	for i, c := range p.Chains {
		name := c.Name()
		fmt.Fprintf(&b, "  subgraph fused_%d [%s]\n", i, mermaidQuote("fused: "+name+" (one hop)"))
		for _, n := range g.Nodes {
			if n.Chain == name {
				node("    ", n)
			}
		}
		b.WriteString("  end\n")
	}
	// Dead letters and side outputs are dotted, and coloured as in DOT: linkStyle names links by
	// their position among the chart's links, which are these edges, in this order.
	var deadLinks, sideLinks []string
	for i, e := range g.Edges {
		switch {
		case e.Kind == EdgeDeadLetter:
			deadLinks = append(deadLinks, fmt.Sprint(i))
			fmt.Fprintf(&b, "  %s -. dead letters .-> %s\n", mermaidID(e.From), mermaidID(e.To))
		case e.Kind == EdgeSideOutput:
			sideLinks = append(sideLinks, fmt.Sprint(i))
			fmt.Fprintf(&b, "  %s -. %s .-> %s\n", mermaidID(e.From), e.Label, mermaidID(e.To)) // an attribute's name
		case e.Kind == EdgeLookup:
			fmt.Fprintf(&b, "  %s -. lookup .-> %s\n", mermaidID(e.From), mermaidID(e.To))
		case e.Fused:
			fmt.Fprintf(&b, "  %s -- in memory --> %s\n", mermaidID(e.From), mermaidID(e.To))
		case e.Label != "":
			fmt.Fprintf(&b, "  %s -- %s --> %s\n", mermaidID(e.From), mermaidQuote(e.Label), mermaidID(e.To))
		default:
			fmt.Fprintf(&b, "  %s --> %s\n", mermaidID(e.From), mermaidID(e.To))
		}
	}
	if len(deadLinks) > 0 {
		fmt.Fprintf(&b, "  linkStyle %s stroke:#c0392b,color:#c0392b\n", strings.Join(deadLinks, ","))
	}
	if len(sideLinks) > 0 {
		fmt.Fprintf(&b, "  linkStyle %s stroke:#7d3c98,color:#7d3c98\n", strings.Join(sideLinks, ","))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mermaidID turns an address into a Mermaid node id, which allows letters, digits and underscores.
func mermaidID(addr string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, addr)
}

// mermaidQuote quotes a Mermaid label; quotes and angle brackets other than <br/> become entities.
func mermaidQuote(s string) string {
	r := strings.NewReplacer(`"`, "#quot;", "<br/>", "<br/>", "<", "#lt;", ">", "#gt;")
	return `"` + r.Replace(s) + `"`
}

// Describe returns the plan as plain data (maps, slices, strings, numbers) for JSON output, with the
// values of sensitive variables redacted.
func (p *Plan) Describe() map[string]any {
	topics := []any{}
	for _, t := range p.Topics {
		d := map[string]any{"name": t.Name, "partitions": t.Partitions, "implicit": t.Implicit}
		if p.Fused(t) {
			d["fused"] = true // a link of a chain: no stream holds it
		}
		if t.Key != nil {
			d["key"] = t.Key.String()
		}
		if t.Retention.MaxLen > 0 {
			d["max_len"] = t.Retention.MaxLen
		}
		if t.Retention.MaxAge > 0 {
			d["max_age"] = FormatDuration(t.Retention.MaxAge)
		}
		if t.MaxLag > 0 {
			d["max_lag"] = t.MaxLag
		}
		if w := t.Watermark; w != nil {
			var domains, writers []string
			for _, dom := range w.Domains {
				domains = append(domains, dom.String())
			}
			for _, wr := range w.Writers {
				writers = append(writers, wr.Name())
			}
			d["watermark"] = map[string]any{"event_times": domains, "writers": writers, "idle_timeout": FormatDuration(w.IdleTimeout)}
		}
		topics = append(topics, d)
	}
	sources := []any{}
	for _, s := range p.Sources {
		sources = append(sources, map[string]any{
			"name": s.Name, "kind": s.Kind, "output": topicName(s.Output), "config": p.describeAttrs(s.Config),
		})
	}
	rules := map[string]WatermarkRule{}
	for _, r := range p.WatermarkRules() {
		rules[r.Stage] = r
	}
	stages := []any{}
	for _, s := range p.Stages {
		d := map[string]any{
			"name": s.Name, "kind": s.Kind, "input": topicName(s.Input), "output": topicName(s.Output),
			"retry": describeRetry(s.Retry), "dead_letter": topicName(s.DeadLetter), "ordering": string(s.Ordering),
			"concurrency": s.Concurrency, "timeout": FormatDuration(s.Timeout), "delivery": string(s.Delivery),
			"fuse": s.Fuse, "config": p.describeAttrs(s.Config),
		}
		if s.Chain != nil {
			d["chain"] = s.Chain.Name()
		}
		if r, ok := rules[s.Name]; ok {
			d["watermark"] = r
		}
		stages = append(stages, d)
	}
	chains := []any{}
	for _, c := range p.Chains {
		chains = append(chains, map[string]any{"name": c.Name(), "stages": c.Names()})
	}
	sinks := []any{}
	for _, s := range p.Sinks {
		d := map[string]any{
			"name": s.Name, "kind": s.Kind, "input": topicName(s.Input), "retry": describeRetry(s.Retry),
			"dead_letter": topicName(s.DeadLetter), "delivery": string(s.Delivery), "config": p.describeAttrs(s.Config),
		}
		if s.Where != nil {
			d["where"] = s.Where.String()
		}
		sinks = append(sinks, d)
	}
	edges := []any{}
	for _, e := range p.Edges {
		d := map[string]any{"from": e.From, "to": e.To, "kind": string(e.Kind)}
		if e.Label != "" {
			d["label"] = e.Label
		}
		edges = append(edges, d)
	}
	return map[string]any{
		"name": p.Name, "description": p.Description, "key_prefix": p.KeyPrefix, "delivery": string(p.Delivery),
		"topics": topics, "sources": sources, "stages": stages, "sinks": sinks, "edges": edges, "chains": chains,
	}
}

func topicName(t *Topic) any {
	if t == nil {
		return nil
	}
	return t.Name
}

func describeRetry(r RetryPolicy) map[string]any {
	return map[string]any{
		"name": r.Name, "max_attempts": r.MaxAttempts, "max_elapsed": FormatDuration(r.MaxElapsed),
		"backoff": string(r.Backoff), "initial": FormatDuration(r.Initial), "max": FormatDuration(r.Max),
		"jitter": r.Jitter,
	}
}

// describeAttrs renders a kind's attributes: expressions as their source, topics by name, durations
// as written.
func (p *Plan) describeAttrs(a Attrs) map[string]any {
	out := map[string]any{}
	for _, name := range sortedKeys(a.values) {
		out[name] = p.describeValue(a.values[name])
	}
	for _, name := range sortedKeys(a.blocks) {
		var list []any
		for _, b := range a.blocks[name] {
			list = append(list, p.describeAttrs(b))
		}
		out[name] = list
	}
	return out
}

func (p *Plan) describeValue(v any) any {
	switch v := v.(type) {
	case *expr.Program:
		return v.String()
	case []Field:
		m := map[string]any{}
		for _, f := range v {
			m[f.Name] = f.Expr.String()
		}
		return m
	case *Topic:
		return v.Name
	case *Table:
		return v.Name
	case time.Duration:
		return FormatDuration(v)
	case string:
		return p.Redact(v)
	case map[string]string:
		m := map[string]any{}
		for k, s := range v {
			m[k] = p.Redact(s)
		}
		return m
	case []string:
		out := make([]string, len(v))
		for i, s := range v {
			out[i] = p.Redact(s)
		}
		return out
	}
	return v
}

// Redact replaces the values of sensitive variables in s with "(sensitive)". Values shorter than
// four characters are left alone: replacing them would garble text more than it would protect.
func (p *Plan) Redact(s string) string {
	for _, secret := range p.secrets {
		s = strings.ReplaceAll(s, secret, "(sensitive)")
	}
	return s
}

// HasSecrets reports whether any variable is sensitive and has a value that Redact would hide.
func (p *Plan) HasSecrets() bool { return len(p.secrets) > 0 }

// sensitiveStrings lists the string forms of the sensitive variables' values, longest first.
func (p *Plan) sensitiveStrings() []string {
	var out []string
	for _, v := range p.Variables {
		if !v.Sensitive || !v.Value.IsWhollyKnown() || v.Value.IsNull() {
			continue
		}
		collectStrings(expr.FromCty(v.Value), &out)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func collectStrings(v any, out *[]string) {
	switch v := v.(type) {
	case string:
		if len(v) >= 4 {
			*out = append(*out, v)
		}
	case []any:
		for _, e := range v {
			collectStrings(e, out)
		}
	case map[string]any:
		for _, e := range v {
			collectStrings(e, out)
		}
	default:
		if v != nil {
			if s := fmt.Sprint(v); len(s) >= 4 {
				*out = append(*out, s)
			}
		}
	}
}
