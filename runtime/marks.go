package runtime

import (
	"context"
	"strconv"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/state"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The watermarks of a unit as the plan says (worker_time.go runs them): its state.Spec (the
// domains, the marks it reads and writes, the writers of its input), the close mark a job's end
// sets, and the watermarks hashes a run reopens at start.

// timeSpec returns the watermark spec of a unit; nil for a unit that keeps none.
func (r *processing) timeSpec(u *unit) *state.Spec {
	n := u.node
	var spec *state.Spec
	switch {
	case n.stage != nil && n.stage.Watermark != nil:
		sw := n.stage.Watermark
		spec = &state.Spec{Domains: sw.Domains, Own: sw.Own, Stateful: n.stateful, Measures: sw.Measures, IdleTimeout: sw.IdleTimeout}
	case n.source != nil && n.source.Output.Watermark != nil:
		tw := n.source.Output.Watermark
		spec = &state.Spec{Domains: tw.Domains, Own: -1, Measures: true, IdleTimeout: tw.IdleTimeout}
	default:
		return nil
	}
	spec.Stream, spec.Group = u.stream, n.group
	if !spec.Measures {
		spec.Marks = r.keys.Watermarks(n.input.Name, u.partition)
		spec.Writers = writerNames(n.input, u.partition)
	}
	for _, w := range r.writesOf(n) {
		spec.Outputs = append(spec.Outputs, r.timeOutput(spec, w, u.partition))
	}
	spec.Close = closeMarkOf(r.keys, u)
	if spec.Measures {
		spec.Carries = carriedDomains(spec, n.stage != nil && n.stage.Side != "")
	}
	return spec
}

// carriedDomains are the domains whose watermarks a measuring unit puts in the messages it passes
// on (stages.WatermarkHeader): those its pass-through outputs need, and a join side's own, which
// it tags its messages with for the join (flow/sides.go); but the entry's time, which never goes
// back where it is measured.
func carriedDomains(spec *state.Spec, side bool) []int {
	var out []int
	seen := map[int]bool{}
	if side && spec.Own >= 0 && spec.Domains[spec.Own].Name != "" {
		seen[spec.Own] = true
		out = append(out, spec.Own)
	}
	for _, o := range spec.Outputs {
		if o.Results {
			continue
		}
		for _, d := range o.From {
			if d >= 0 && !seen[d] && spec.Domains[d].Name != "" {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}

// closeMarkOf is where a timed unit says it has closed: a field of its input partition's watermarks
// hash, in the slot of its commits; for a stream source, which reads no topic, of its output's first.
func closeMarkOf(keys redis.Keys, u *unit) state.CloseMark {
	n := u.node
	if n.input != nil {
		return state.CloseMark{Hash: keys.Watermarks(n.input.Name, u.partition), Field: redis.MarkField(n.typ+"."+n.name, "closed")}
	}
	return state.CloseMark{Hash: keys.Watermarks(n.source.Output.Name, 0), Field: redis.MarkField(n.typ+"."+n.name, "closed")}
}

// timed reports whether a node keeps watermarks: it feeds a stateful stage, or is one.
func (n *node) timed() bool {
	return n.stage != nil && n.stage.Watermark != nil || n.source != nil && n.source.Output.Watermark != nil
}

// writerNames names the writers of partition p of topic t in its watermarks hash.
func writerNames(t *flow.Topic, p int) []string {
	var names []string
	for _, w := range t.Watermark.Writers {
		switch {
		case w.Source != nil:
			names = append(names, "source."+w.Source.Name)
		case w.SamePartition:
			names = append(names, "stage."+w.Stage.Name+":"+strconv.Itoa(p))
		default:
			for q := range w.Stage.Input.Partitions {
				names = append(names, "stage."+w.Stage.Name+":"+strconv.Itoa(q))
			}
		}
	}
	return names
}

// topicWrite is a topic that a node's units write, with the stage that writes it (in a fused chain,
// one of the chain's stages) as its writer in the plan.
type topicWrite struct {
	topic  *flow.Topic
	writer flow.Writer
}

// writesOf lists the topics with watermarks that a node's units write: its own outputs, or a chain's
// (the outputs of its stages but the links between them).
func (r *processing) writesOf(n *node) []topicWrite {
	stages := []*node{n}
	if n.chain != nil {
		stages = n.chain.nodes
	}
	var out []topicWrite
	for i, s := range stages {
		var topics []*flow.Topic
		var self string
		switch {
		case s.stage != nil:
			topics, self = s.stage.Outputs(), "stage."+s.stage.Name
		case s.source != nil:
			topics, self = []*flow.Topic{s.source.Output}, "source."+s.source.Name
		}
		for _, t := range topics {
			if t.Watermark == nil || (i+1 < len(stages) && stages[i+1].input == t) {
				continue
			}
			for _, w := range t.Watermark.Writers {
				if w.Name() == self {
					out = append(out, topicWrite{topic: t, writer: w})
				}
			}
		}
	}
	return out
}

// timeOutput is where a unit on partition p passes its watermarks on in one topic it writes.
func (r *processing) timeOutput(spec *state.Spec, tw topicWrite, p int) state.Output {
	o := state.Output{Results: tw.writer.Results, Writer: tw.writer.Name()}
	if tw.writer.Stage != nil {
		o.Writer += ":" + strconv.Itoa(p)
	}
	if tw.writer.SamePartition {
		o.Hashes = []string{r.keys.Watermarks(tw.topic.Name, p)}
	} else {
		for q := range tw.topic.Partitions {
			o.Hashes = append(o.Hashes, r.keys.Watermarks(tw.topic.Name, q))
		}
	}
	for _, d := range tw.topic.Watermark.Domains {
		o.Names = append(o.Names, d.Name)
		from := -1
		for i, own := range spec.Domains {
			if own.Name == d.Name {
				from = i
			}
		}
		o.From = append(o.From, from)
	}
	return o
}

// markHashes are the watermarks hashes of every partition of the topics with watermarks that a
// process's nodes read or write, its producing sources' outputs (sourceOutputs) included.
func markHashes(keys redis.Keys, nodes []*node, sourceOutputs []*flow.Topic) []string {
	seen := map[string]bool{}
	var out []string
	add := func(t *flow.Topic) {
		if t == nil || t.Watermark == nil || seen[t.Name] {
			return
		}
		seen[t.Name] = true
		for p := range t.Partitions {
			out = append(out, keys.Watermarks(t.Name, p))
		}
	}
	for _, n := range nodes {
		add(n.input)
		switch {
		case n.stage != nil:
			for _, t := range n.stage.Outputs() {
				add(t)
			}
		case n.source != nil:
			add(n.source.Output)
		}
	}
	for _, t := range sourceOutputs {
		add(t)
	}
	return out
}

// reopenMarks takes back the closes that the end of an earlier job left in the watermarks (a
// closed writer counts as later than any time), before anything reads them: this run goes on
// from the watermarks as they were before.
func reopenMarks(ctx context.Context, rdb *redis.Client, hashes []string) error {
	if len(hashes) == 0 {
		return nil
	}
	return rdb.ReopenMarks(ctx, hashes)
}
