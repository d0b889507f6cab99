package runtime

import (
	"context"
	"fmt"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A fused chain (flow.Chain) runs in the units of its first stage: a batch is read once from the
// chain's input, each message goes through the stages in turn in memory, and the last stage's
// outputs are committed with the input's acknowledgement, once. Each stage keeps its own layers
// (retries, timeout, dead letters, metrics, span): a stage's result is handed to the next stage as
// the entry it would have written, so that what the next stage sees is exactly what it would have
// read from the stream between them. A stage after the first whose retry waits in Redis parks, in
// the chain's retry set, the message as the stage before it made it, with the stage's name: its
// next attempt starts at that stage.

// fusion wires the plan's chains into the nodes this process runs, at start, and unwires the links
// that still hold work from a run without fusion. What a chain does with each message is fused.go.
type fusion struct {
	*processing // a chain's head processes through fused; the keys; the logger
	plan        *flow.Plan
	rdb         *redis.Client
	nodes       []*node       // the nodes this process runs, assembled
	units       *[]*unit      // the runner's: a stage fused after another has none of its own
	addUnits    func(n *node) // adds a node's units to the runner's
}

// fuse wires the plan's chains into this process's nodes (in newRunner, before the run, so that
// what the run will send, accessChecks, is known), running unfused the links into the stages of
// cut. A stage after the first of a chain has no units of its own.
func (r *fusion) fuse(cut map[string]bool) {
	stagesByName := map[string]*node{}
	for _, n := range r.nodes {
		if n.typ == "stage" {
			stagesByName[n.name] = n
		}
	}
	for _, fc := range r.plan.Chains {
		var run []*node
		flush := func() {
			if len(run) > 1 {
				r.newChain(run)
			}
			run = nil
		}
		for _, s := range fc.Stages {
			n := stagesByName[s.Name]
			if n == nil || cut[s.Name] { // not selected (Options.Nodes takes a chain whole), or cut
				flush()
			}
			if n != nil {
				run = append(run, n)
			}
		}
		flush()
	}
	for _, n := range r.nodes {
		if n.typ == "stage" && n.input != nil && n.resumeAs == "" && !r.hasUnits(n) {
			r.addUnits(n)
		}
	}
}

// checkFusedLinks runs unfused, this time, each link of a chain whose stream still holds work
// from a run without fusion (leftovers), so that its entries are processed: entries the stage has
// not read or not acknowledged, retries waiting for it. Where Redis cannot tell, the link runs as a
// stream too: that is never wrong.
func (r *fusion) checkFusedLinks(ctx context.Context) {
	cut := map[string]bool{}
	var chains []*chain
	for _, n := range r.nodes {
		if n.chain != nil && n.chain.nodes[0] == n {
			chains = append(chains, n.chain)
		}
	}
	for _, c := range chains {
		for i, n := range c.nodes[1:] {
			left, err := r.linkLeftovers(ctx, n)
			if err != nil {
				left = "its input could not be checked for entries left from an earlier run: " + err.Error()
			}
			if left != "" {
				r.log.Warn("stage runs unfused this time: "+left, "stage", n.name, "after", c.nodes[i].name)
				cut[n.name] = true
			}
		}
	}
	if len(cut) == 0 {
		return
	}
	for _, c := range chains {
		r.unchain(c)
	}
	r.fuse(cut)
}

// unchain undoes newChain.
func (r *fusion) unchain(c *chain) {
	head := c.nodes[0]
	head.process = c.steps[0]
	head.inline, head.lanes, head.readCount = c.head.inline, c.head.lanes, c.head.readCount
	for _, n := range c.nodes {
		n.chain, n.resumeAs = nil, ""
	}
}

// linkLeftovers says what the stream that n reads in a chain still holds for it from a run without
// fusion: entries not yet delivered to n's group, entries delivered and not acknowledged, retries
// waiting. "" when nothing.
func (r *fusion) linkLeftovers(ctx context.Context, n *node) (string, error) {
	for p := 0; p < n.input.Partitions; p++ {
		stream := r.keys.Stream(n.input.Name, p)
		st, err := r.rdb.StreamStats(ctx, stream)
		if err != nil {
			return "", err
		}
		for _, g := range st.Groups {
			if g.Name == n.group && (g.Lag > 0 || g.Pending > 0) {
				return fmt.Sprintf("%s still holds %d entries not yet read and %d not yet acknowledged by it", stream, g.Lag, g.Pending), nil
			}
		}
		if len(st.Groups) == 0 && st.Length > 0 {
			return fmt.Sprintf("%s holds %d entries it has not read", stream, st.Length), nil
		}
		if _, waiting, err := r.rdb.NextRetry(ctx, r.keys.Retry(n.input.Name, p, n.name)); err != nil || waiting {
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("messages wait for a retry in %s", r.keys.Retry(n.input.Name, p, n.name)), nil
		}
	}
	return "", nil
}

// hasUnits reports whether n has units in this process.
func (r *fusion) hasUnits(n *node) bool {
	for _, u := range *r.units {
		if u.node == n {
			return true
		}
	}
	return false
}

// newChain makes nodes, in order, one chain whose first node processes for all.
func (r *fusion) newChain(nodes []*node) {
	c := &chain{nodes: nodes}
	for i, n := range nodes {
		if i > 0 {
			c.name += "+"
			n.resumeAs = n.name
		}
		c.name += n.name
		n.chain = c
		c.steps = append(c.steps, n.process)
	}
	head := nodes[0]
	c.head.inline, c.head.lanes, c.head.readCount = head.inline, head.lanes, head.readCount
	for _, n := range nodes[1:] {
		// The chain reads in the lanes of its first stage (the strictest ordering of the chain, see
		// flow.Chain), as many as its most concurrent stage asks for, no more at a time than any of its
		// stages' outputs allow (max_lag).
		head.inline = head.inline && n.inline
		head.lanes = max(head.lanes, n.lanes)
		head.readCount = min(head.readCount, n.readCount)
	}
	head.process = r.fused(c)
	r.log.Debug("stages fused", "chain", c.name)
}
