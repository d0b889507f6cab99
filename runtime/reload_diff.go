package runtime

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flowrun/flowrun/flow"
)

// planDiff is what a reload changes, by node address, in plan order; problems are why it cannot.
type planDiff struct {
	unchanged, changed, added, removed []string
	problems                           []string
}

// diffPlans compares the plan that runs with a new one (reload.go). A reload restarts stages and
// sinks; what else it would have to change in a running process is refused, with what to do:
//
//   - the pipeline's settings (name, key_prefix, delivery, max_message_size) and its sensitive
//     variables, which the run's keys and redaction are made of;
//   - a topic that both plans have, whose partitions, key, retention or max_lag changed: its
//     streams, leases and state are laid out by them; a new topic with retention or max_lag, which
//     the run's trimming and backpressure do not know;
//   - tables, which lookups read through readers made at start;
//   - sources, which run once per pipeline under a lease and have positions of their own.
//
// With Options.Nodes, only the named nodes are compared: those are what this process runs.
func diffPlans(old, next *flow.Plan, opts Options) planDiff {
	var d planDiff
	problem := func(format string, args ...any) { d.problems = append(d.problems, fmt.Sprintf(format, args...)) }
	restart := "restart the process to apply it"
	switch {
	case old.Name != next.Name:
		problem("the pipeline's name changed from %s to %s: %s", old.Name, next.Name, restart)
	case old.KeyPrefix != next.KeyPrefix:
		problem("key_prefix changed from %q to %q: every key of the pipeline would move; %s", old.KeyPrefix, next.KeyPrefix, restart)
	case old.Delivery != next.Delivery:
		problem("the pipeline's delivery changed from %s to %s: %s", old.Delivery, next.Delivery, restart)
	case old.MaxMessageSize != next.MaxMessageSize:
		problem("max_message_size changed from %d to %d: %s", old.MaxMessageSize, next.MaxMessageSize, restart)
	}
	if sensitiveValues(old) != sensitiveValues(next) {
		problem("a sensitive variable changed: the log's redaction is made at start; %s", restart)
	}
	for _, t := range next.Topics {
		was := old.Topic(t.Name)
		if was == nil {
			if t.Retention.MaxLen > 0 || t.Retention.MaxAge > 0 || t.MaxLag > 0 {
				problem("topic %s%s is new with retention or max_lag, which start with the process: %s", t.Name, at(t.Range), restart)
			}
			continue
		}
		if why := topicChange(was, t); why != "" {
			problem("topic %s%s changed (%s): its streams, leases and state are laid out by it; %s", t.Name, at(t.Range), why, restart)
		}
	}
	if tableDefinitions(old) != tableDefinitions(next) {
		problem("the tables changed: lookups read them through readers made at start; %s", restart)
	}
	selected := func(addr string) bool {
		_, name, _ := strings.Cut(addr, ".")
		return len(opts.Nodes) == 0 || slices.Contains(opts.Nodes, name)
	}
	oldIDs, newIDs := identities(old, opts), identities(next, opts)
	for _, addr := range planAddrs(next) {
		if !selected(addr) {
			continue
		}
		was, ok := oldIDs[addr]
		switch {
		case !ok:
			d.added = append(d.added, addr)
		case was == newIDs[addr]:
			d.unchanged = append(d.unchanged, addr)
		default:
			d.changed = append(d.changed, addr)
		}
	}
	for _, addr := range planAddrs(old) {
		if _, ok := newIDs[addr]; !ok && selected(addr) {
			if len(opts.Nodes) > 0 {
				problem("%s is no longer in the pipeline, and this process runs it (--stages): %s", addr, restart)
			}
			d.removed = append(d.removed, addr)
		}
	}
	for _, list := range [][]string{d.changed, d.added, d.removed} {
		for _, addr := range list {
			if strings.HasPrefix(addr, "source.") {
				problem("%s changed, was added or removed: sources run once per pipeline, under a lease and from a position of their own, and a reload does not restart them; %s", addr, restart)
			}
		}
	}
	return d
}

// identities returns each node's identity in a plan, by address: what, when it changes, restarts
// the node. It is the node's definition (flow.Plan.Definitions) with what the run derives for it
// from the rest of the plan: the partitions of the topics it reads and writes, the fused chain it
// runs in (the chain restarts as a whole), the watermarks its units keep.
func identities(p *flow.Plan, opts Options) map[string]string {
	ids := map[string]string{}
	for _, s := range p.Sources {
		ids["source."+s.Name] = p.Definitions["source."+s.Name] + " out " + topicShape(s.Output) + " " + topicMarks(s.Output)
	}
	for _, s := range p.Stages {
		var b strings.Builder
		b.WriteString(p.Definitions["stage."+s.Name] + " kind " + s.Kind + " in " + topicShape(s.Input) + " " + topicMarks(s.Input))
		for _, t := range s.Outputs() {
			b.WriteString(" out " + topicShape(t))
		}
		if s.DeadLetter != nil {
			b.WriteString(" dlq " + topicShape(s.DeadLetter))
		}
		if s.Chain != nil && !opts.NoFusion {
			for _, c := range s.Chain.Stages {
				b.WriteString(" chain " + c.Name + "=" + p.Definitions["stage."+c.Name])
			}
		}
		b.WriteString(" " + stageMarks(s.Watermark))
		ids["stage."+s.Name] = b.String()
	}
	for _, s := range p.Sinks {
		ids["sink."+s.Name] = p.Definitions["sink."+s.Name] + " in " + topicShape(s.Input)
	}
	return ids
}

// topicShape names a topic with its partitions.
func topicShape(t *flow.Topic) string {
	if t == nil {
		return "-"
	}
	return fmt.Sprintf("%s/%d", t.Name, t.Partitions)
}

// topicChange says what changed of a topic that a reload cannot change, or "".
func topicChange(was, now *flow.Topic) string {
	switch {
	case was.Partitions != now.Partitions:
		return fmt.Sprintf("partitions %d, now %d", was.Partitions, now.Partitions)
	case was.Key.String() != now.Key.String():
		return fmt.Sprintf("key %q, now %q", was.Key.String(), now.Key.String())
	case was.Retention != now.Retention:
		return "retention"
	case was.MaxLag != now.MaxLag:
		return fmt.Sprintf("max_lag %d, now %d", was.MaxLag, now.MaxLag)
	}
	return ""
}

// topicMarks describes how a topic's partitions get their watermarks.
func topicMarks(t *flow.Topic) string {
	if t == nil || t.Watermark == nil {
		return "marks -"
	}
	w := t.Watermark
	var b strings.Builder
	fmt.Fprintf(&b, "marks idle=%s", w.IdleTimeout)
	for _, d := range w.Domains {
		b.WriteString(" domain=" + d.Name)
	}
	for _, wr := range w.Writers {
		fmt.Fprintf(&b, " writer=%s/%v/%v", wr.Name(), wr.SamePartition, wr.Results)
	}
	return b.String()
}

// stageMarks describes what a stage's units keep of watermarks.
func stageMarks(w *flow.StageWatermark) string {
	if w == nil {
		return "keeps -"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "keeps own=%d measures=%v idle=%s delayed=%d", w.Own, w.Measures, w.IdleTimeout, w.Delayed)
	for _, d := range w.Domains {
		b.WriteString(" domain=" + d.Name)
	}
	return b.String()
}

// tableDefinitions describes a plan's tables.
func tableDefinitions(p *flow.Plan) string {
	var b strings.Builder
	for _, t := range p.Tables {
		b.WriteString(t.Name + "=" + p.Definitions["stage."+t.Name+".table"] + ";")
	}
	return b.String()
}

// sensitiveValues is the values of a plan's sensitive variables, to compare.
func sensitiveValues(p *flow.Plan) string {
	var b strings.Builder
	for _, v := range p.Variables {
		if v.Sensitive {
			b.WriteString(v.Name + "=" + v.Value.GoString() + ";")
		}
	}
	return b.String()
}

// at says where a block is declared, " (FILE:LINE)", or nothing.
func at(r interface{ String() string }) string {
	s := r.String()
	if s == "" || strings.HasPrefix(s, ":") {
		return ""
	}
	return " (" + s + ")"
}
