package runtime

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/flowrun/flowrun/stages"
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

// fuse wires the plan's chains into this process's nodes (in newRunner, before the run, so that
// what the run will send, accessChecks, is known), running unfused the links into the stages of
// cut. A stage after the first of a chain has no units of its own.
func (r *runner) fuse(cut map[string]bool) {
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
func (r *runner) checkFusedLinks(ctx context.Context) {
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
func (r *runner) unchain(c *chain) {
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
func (r *runner) linkLeftovers(ctx context.Context, n *node) (string, error) {
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
func (r *runner) hasUnits(n *node) bool {
	for _, u := range r.units {
		if u.node == n {
			return true
		}
	}
	return false
}

// newChain makes nodes, in order, one chain whose first node processes for all.
func (r *runner) newChain(nodes []*node) {
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

// fused is the messageFunc of a chain's first node: the message through the chain.
func (r *runner) fused(c *chain) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		from := 0
		if m.retry != nil && m.retry.Stage != "" {
			from = c.index(m.retry.Stage) // in the chain: processMessage hands on the others
		}
		var local [4]counts // what the message did at each stage; longer chains allocate
		per := local[:]
		if len(c.nodes) > len(local) {
			per = make([]counts, len(c.nodes))
		}
		per = per[:len(c.nodes)]
		res, buf := r.runChain(ctx, c, from, m, m.fresh(), buf, p, per)
		if !res.abandoned && p.counts != nil {
			p.counts.addChain(per) // counted once the batch commits (outcomes.go)
		}
		return res, buf, nil
	}
}

// runChain runs m through the chain's stages from the i-th one (fresh: m is new to that stage, see
// message.fresh). The outputs of the last stage are appended to buf, and the result's outs is the
// appended part; per counts what became of the messages at each stage.
func (r *runner) runChain(ctx context.Context, c *chain, i int, m *message, fresh bool, buf []redis.Output, p pass, per []counts) (result, []redis.Output) {
	start := len(buf)
	res, buf, _ := c.steps[i](ctx, m, buf, p)
	if res.abandoned {
		return res, buf
	}
	per[i].settle(m, &res, fresh)
	if i == len(c.nodes)-1 || len(res.deadLetters)+len(res.retries) > 0 {
		return res, buf
	}
	// The stage's outputs are the next stage's messages: take them out of buf, which the next
	// stage's outputs fill in their place.
	made := res.outs
	if len(made) == 1 {
		made = []redis.Output{made[0]} // does not escape: the common case allocates nothing more
	} else {
		made = append([]redis.Output(nil), made...)
	}
	buf = buf[:start]
	var all result
	for j := range made {
		e := made[j].Entry
		mj := message{id: m.id, path: m.path, partition: m.partition, trace: traceOf(e)}
		if len(made) > 1 {
			mj.path = m.path + "." + strconv.Itoa(j)
			mj.msg = stages.NewMessage(e.Key, e.Payload, e.Headers)
		} else {
			// A message that stage passed on unchanged (a filter's) keeps the fields it decoded.
			mj.msg = stages.PassedOn(e.Key, e.Payload, e.Headers, &m.msg)
		}
		rj, b := r.runChain(ctx, c, i+1, &mj, true, buf, p, per)
		buf = b
		if rj.abandoned {
			// The whole entry comes again after the restart: drop what its other messages made.
			return result{abandoned: true}, buf[:start]
		}
		all.deadLetters = append(all.deadLetters, rj.deadLetters...)
		all.retries = append(all.retries, rj.retries...)
	}
	all.outs = buf[start:len(buf):len(buf)]
	return all, buf
}

// handOn passes on a due retry for a stage that does not run in head's chain (the pipeline changed,
// or the link runs unfused this time): to the stage's input topic, which it then reads, as the stage
// before it would have written it. A stage that is gone, or fused after another one now, cannot
// take it that way: the message is dead-lettered, to be replayed from there (flowrun dlq replay).
func (r *runner) handOn(head *node, m *message, buf []redis.Output, _ pass) (result, []redis.Output, error) {
	m.outcome = outcomeHandedOn // new to head, which counts it (worker.prepare)
	var to *node
	for _, n := range r.nodes {
		if n.typ == "stage" && n.name == m.retry.Stage {
			to = n
			break
		}
	}
	if to == nil || to.input == nil || to.resumeAs != "" {
		err := errors.New("a retry waited here for stage " + m.retry.Stage + ", which this process does not run as a stage with a stream of its own " +
			"(the pipeline changed); replay the message to send it where the stage runs now")
		return result{deadLetters: []redis.Output{r.deadLetterMessage(head, m, err, m.attempts, m.firstFailure)}}, buf, err
	}
	out, err := r.topicOutput(head, m, to.input, &m.msg, 0, m.partition)
	if err != nil {
		return result{deadLetters: []redis.Output{r.deadLetterMessage(head, m, err, m.attempts, m.firstFailure)}}, buf, err
	}
	out.Entry.TraceParent, out.Entry.TraceState = m.trace.parent, m.trace.state
	buf = append(buf, out)
	return result{outs: buf[len(buf)-1 : len(buf) : len(buf)]}, buf, nil
}
