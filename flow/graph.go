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

// graphNode is a node of the rendered graph: a source, stage, sink or topic.
type graphNode struct {
	ID    string   // the address, such as stage.enrich
	Shape string   // source, stage, sink or topic
	Lines []string // the label, one line each
}

// graphNodes lists the plan's nodes in a stable order: sources, topics, stages, sinks. Implicit
// topics are left out: drawings show a stage read as stage.NAME as an edge to its reader.
func graphNodes(p *Plan) []graphNode {
	var nodes []graphNode
	for _, s := range p.Sources {
		nodes = append(nodes, graphNode{ID: "source." + s.Name, Shape: "source", Lines: []string{s.Name, s.Kind + " source"}})
	}
	for _, t := range p.Topics {
		if t.Implicit {
			continue
		}
		lines := []string{t.Name, fmt.Sprintf("%d partition%s", t.Partitions, plural(t.Partitions))}
		if t.Key != nil {
			lines = append(lines, "key: "+t.Key.String())
		}
		nodes = append(nodes, graphNode{ID: "topic." + t.Name, Shape: "topic", Lines: lines})
	}
	for _, s := range p.Stages {
		lines := []string{s.Name, s.Kind + " stage"}
		if s.Spec != nil && s.Spec.Detail != nil {
			lines[1] = s.Spec.Detail(s.Config)
		}
		lines = append(lines, retryLine(s.Retry))
		nodes = append(nodes, graphNode{ID: "stage." + s.Name, Shape: "stage", Lines: lines})
	}
	for _, s := range p.Sinks {
		nodes = append(nodes, graphNode{ID: "sink." + s.Name, Shape: "sink", Lines: []string{s.Name, s.Kind + " sink", retryLine(s.Retry)}})
	}
	return nodes
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

// graphEdges lists the plan's edges for drawing, with each implicit topic replaced by direct edges
// from the stage that writes it to the nodes that read it.
func graphEdges(p *Plan) []Edge {
	implicit := map[string]bool{}
	for _, t := range p.Topics {
		if t.Implicit {
			implicit["topic."+t.Name] = true
		}
	}
	writers := map[string][]string{}
	for _, e := range p.Edges {
		if implicit[e.To] {
			writers[e.To] = append(writers[e.To], e.From)
		}
	}
	var out []Edge
	for _, e := range p.Edges {
		switch {
		case implicit[e.To]:
		case implicit[e.From]:
			for _, w := range writers[e.From] {
				out = append(out, Edge{From: w, To: e.To, Kind: EdgeWrites})
			}
		default:
			out = append(out, e)
		}
	}
	return out
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
	for _, n := range graphNodes(p) {
		fmt.Fprintf(&b, "  %s [%s, label=%s];\n", dotQuote(n.ID), shapes[n.Shape], dotQuote(strings.Join(n.Lines, "\n")))
	}
	for _, e := range graphEdges(p) {
		var attrs []string
		if e.Kind == EdgeDeadLetter {
			attrs = append(attrs, `style=dashed`, `color="#c0392b"`, `fontcolor="#c0392b"`, `label="dead letters"`)
		} else if e.Label != "" {
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
	for _, n := range graphNodes(p) {
		fmt.Fprintf(&b, "  %s%s%s%s\n", mermaidID(n.ID), open[n.Shape], mermaidQuote(strings.Join(n.Lines, "<br/>")), closing[n.Shape])
	}
	for _, e := range graphEdges(p) {
		switch {
		case e.Kind == EdgeDeadLetter:
			fmt.Fprintf(&b, "  %s -. dead letters .-> %s\n", mermaidID(e.From), mermaidID(e.To))
		case e.Label != "":
			fmt.Fprintf(&b, "  %s -- %s --> %s\n", mermaidID(e.From), mermaidQuote(e.Label), mermaidID(e.To))
		default:
			fmt.Fprintf(&b, "  %s --> %s\n", mermaidID(e.From), mermaidID(e.To))
		}
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
		topics = append(topics, d)
	}
	sources := []any{}
	for _, s := range p.Sources {
		sources = append(sources, map[string]any{
			"name": s.Name, "kind": s.Kind, "output": topicName(s.Output), "config": p.describeAttrs(s.Config),
		})
	}
	stages := []any{}
	for _, s := range p.Stages {
		stages = append(stages, map[string]any{
			"name": s.Name, "kind": s.Kind, "input": topicName(s.Input), "output": topicName(s.Output),
			"retry": describeRetry(s.Retry), "dead_letter": topicName(s.DeadLetter), "ordering": string(s.Ordering),
			"concurrency": s.Concurrency, "timeout": FormatDuration(s.Timeout), "delivery": string(s.Delivery),
			"config": p.describeAttrs(s.Config),
		})
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
		"topics": topics, "sources": sources, "stages": stages, "sinks": sinks, "edges": edges,
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
