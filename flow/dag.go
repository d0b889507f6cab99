package flow

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// The plan is a graph of nodes (sources, stages, sinks) and topics. Edges go from a topic to the nodes
// that read it and from a node to the topics it writes. This file builds the edges, orders the stages,
// and reports what makes the graph invalid (cycles) or suspicious (topics nobody reads).

// checkGraph builds the plan's edges, orders its stages and checks the graph's shape.
func (c *compiler) checkGraph(blocks map[*Stage]*Block) {
	p := c.plan
	for _, s := range p.Sources {
		if s.Output != nil {
			p.Edges = append(p.Edges, Edge{From: "source." + s.Name, To: "topic." + s.Output.Name, Kind: EdgeWrites})
		}
	}
	for _, s := range p.Stages {
		from := "stage." + s.Name
		if s.Input != nil {
			p.Edges = append(p.Edges, Edge{From: "topic." + s.Input.Name, To: from, Kind: EdgeReads})
		}
		if s.Output != nil {
			p.Edges = append(p.Edges, Edge{From: from, To: "topic." + s.Output.Name, Kind: EdgeWrites})
		}
		if s.Spec != nil && s.Spec.OwnOutputs != nil {
			for _, o := range s.Spec.OwnOutputs(s.Config) {
				p.Edges = append(p.Edges, Edge{From: from, To: "topic." + o.Topic.Name, Kind: EdgeWrites, Label: o.Label})
			}
		}
		for _, o := range s.SideOutputs() {
			p.Edges = append(p.Edges, Edge{From: from, To: "topic." + o.Topic.Name, Kind: EdgeSideOutput, Label: o.Label})
		}
		if s.DeadLetter != nil {
			p.Edges = append(p.Edges, Edge{From: from, To: "topic." + s.DeadLetter.Name, Kind: EdgeDeadLetter})
		}
	}
	for _, s := range p.Sinks {
		to := "sink." + s.Name
		if s.Input != nil {
			p.Edges = append(p.Edges, Edge{From: "topic." + s.Input.Name, To: to, Kind: EdgeReads})
		}
		if s.DeadLetter != nil {
			p.Edges = append(p.Edges, Edge{From: to, To: "topic." + s.DeadLetter.Name, Kind: EdgeDeadLetter})
		}
	}
	c.checkCycles(blocks)
	c.orderStages()
	if !c.unresolved {
		c.checkUnused()
	}
}

// checkCycles reports every cycle of the data flow with its path. Dead-letter and side-output
// edges do not count: a stage that repairs dead letters (or late events, or duplicates) and feeds
// them back is a legitimate loop that only those messages take.
func (c *compiler) checkCycles(blocks map[*Stage]*Block) {
	next := map[string][]string{}
	for _, e := range c.plan.Edges {
		if e.Kind != EdgeDeadLetter && e.Kind != EdgeSideOutput {
			next[e.From] = append(next[e.From], e.To)
		}
	}
	for _, n := range next {
		sort.Strings(n)
	}
	// A cycle is reported at the input that closes it: the edge into its first stage is that
	// stage's input, the one reference of the cycle that the message can point at.
	ranges := map[string]hcl.Range{}
	for s, b := range blocks {
		ranges["stage."+s.Name] = b.DeclRange
		if in, ok := b.Attributes["input"]; ok {
			ranges["stage."+s.Name] = in.Expr.Range()
		}
	}

	const (
		unvisited = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	reported := map[string]bool{}
	var visit func(n string)
	visit = func(n string) {
		state[n] = onPath
		path = append(path, n)
		for _, m := range next[n] {
			switch state[m] {
			case unvisited:
				visit(m)
			case onPath:
				start := 0
				for i, x := range path {
					if x == m {
						start = i
					}
				}
				cycle := append(append([]string(nil), path[start:]...), m)
				c.reportCycle(cycle, ranges, reported)
			}
		}
		path = path[:len(path)-1]
		state[n] = done
	}
	nodes := sortedKeys(next)
	for _, n := range nodes {
		if state[n] == unvisited {
			visit(n)
		}
	}
}

// reportCycle reports a cycle once, starting from its alphabetically first stage so that the message
// is the same whichever node the search started from, at that stage's input. The implicit topics of
// stages read as stage.NAME are left out of the path, which then reads as the references do.
func (c *compiler) reportCycle(cycle []string, ranges map[string]hcl.Range, reported map[string]bool) {
	nodes := cycle[:len(cycle)-1]
	first := 0
	for i, n := range nodes {
		if strings.HasPrefix(n, "stage.") && (!strings.HasPrefix(nodes[first], "stage.") || n < nodes[first]) {
			first = i
		}
	}
	rotated := append(append(append([]string(nil), nodes[first:]...), nodes[:first]...), nodes[first])
	key := strings.Join(rotated, " ")
	if reported[key] {
		return
	}
	reported[key] = true
	var path []string
	for _, n := range rotated {
		if t, ok := strings.CutPrefix(n, "topic."); ok && c.isImplicit(t) {
			continue
		}
		path = append(path, n)
	}
	c.errorf(ranges[rotated[0]], "Cycle in the pipeline",
		fmt.Sprintf("Messages would flow in a circle: %s. This input closes it; break the cycle, as a pipeline is a directed acyclic graph.",
			strings.Join(path, " → ")))
}

// isImplicit reports whether a topic is the implicit output of a stage.
func (c *compiler) isImplicit(topic string) bool {
	for _, t := range c.implicit {
		if t.Name == topic {
			return true
		}
	}
	return false
}

// orderStages sorts the stages so that each comes after the stages that feed it, keeping
// declaration order among independent stages.
func (c *compiler) orderStages() {
	writers := map[string][]int{} // topic name -> indexes of the stages writing it
	for i, s := range c.plan.Stages {
		for _, t := range s.Outputs() {
			writers[t.Name] = append(writers[t.Name], i)
		}
	}
	index := map[*Stage]int{}
	for i, s := range c.plan.Stages {
		index[s] = i
	}
	placed := make([]bool, len(c.plan.Stages))
	var ordered []*Stage
	var place func(i int, depth int)
	place = func(i int, depth int) {
		if placed[i] || depth > len(c.plan.Stages) { // the depth bound stops at cycles, reported already
			return
		}
		if in := c.plan.Stages[i].Input; in != nil {
			for _, w := range writers[in.Name] {
				place(w, depth+1)
			}
		}
		for _, t := range c.plan.Stages[i].Config.tableRefs() { // a lookup after the table it reads
			if j, ok := index[t.Stage]; ok && t.Stage != nil {
				place(j, depth+1)
			}
		}
		if !placed[i] {
			placed[i] = true
			ordered = append(ordered, c.plan.Stages[i])
		}
	}
	for i := range c.plan.Stages {
		place(i, 0)
	}
	c.plan.Stages = ordered
}

// checkUnused warns about topics and retry policies that nothing uses, and about topics that are
// written but never read.
func (c *compiler) checkUnused() {
	read := map[string]bool{}
	deadLetter := map[string]bool{}
	for _, e := range c.plan.Edges {
		switch e.Kind {
		case EdgeReads:
			read[e.From] = true
		case EdgeDeadLetter:
			deadLetter[e.To] = true
		}
	}
	for _, b := range c.cfg.Topics {
		addr := "topic." + b.Name
		switch {
		case !c.topicUsed[b.Name]:
			c.warnf(b.LabelRange, "Unused topic",
				fmt.Sprintf("Nothing reads or writes topic %q. Remove it, or connect it with input or output = topic.%s.", b.Name, b.Name))
		case !read[addr] && !deadLetter[addr]:
			c.warnf(b.LabelRange, "Topic is never read",
				fmt.Sprintf("Messages written to topic %q are kept but never processed: no stage or sink reads it.", b.Name))
		}
	}
	for _, b := range c.cfg.Tables {
		if !c.tableUsed[b.Name] {
			c.warnf(b.LabelRange, "Unused table",
				fmt.Sprintf("No lookup stage reads table %q, which is kept all the same. Read it with table = table.%s in a lookup stage, or remove it.", b.Name, b.Name))
		}
	}
	for _, b := range c.cfg.Retries {
		if !c.retryUsed[b.Name] {
			c.warnf(b.LabelRange, "Unused retry policy",
				fmt.Sprintf("No stage or sink uses retry %q. Use it with retry = retry.%s, or remove it.", b.Name, b.Name))
		}
	}
}
