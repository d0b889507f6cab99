package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/backpressure"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// accessCheck is what the check of the Redis user's permissions needs to know of the run: the
// nodes, units and producing sources this process runs, with the keys and streams they use
// (processing), the plan, the backpressure gates and the client to ask.
type accessCheck struct {
	*processing
	rdb          *redis.Client
	plan         *flow.Plan
	nodes        []*node
	units        []*unit
	producers    []*producingSource
	backpressure *backpressure.Gates
	resetState   []string // the stateful stages whose state the run may delete (Options.ResetState)
}

// checkAccess asks Redis, before the run reads or writes anything, whether its user may send
// everything the run will send, on the keys it will send it on. A user restricted to other keys,
// or one without a command the pipeline needs, ends the run at start with one error naming the
// command or key and the ACL rule that grants it, instead of failing in the middle, after part of
// the work is done. A server that cannot tell (the embedded Redis, Redis before 7.0) is not
// checked; a check that fails for another reason (a connection drop) leaves the run to find out.
func (r *accessCheck) checkAccess(ctx context.Context) error {
	checks := r.accessChecks().Checks()
	err := r.rdb.CheckAccess(ctx, checks)
	switch {
	case err == nil:
		r.log.Debug("the Redis user may do what the pipeline needs", "user", r.rdb.User(), "checks", len(checks))
		return r.checkStreams(ctx)
	case errors.Is(err, redis.ErrAccessUnchecked):
		r.log.Debug("not checking the Redis user's permissions", "reason", err)
		return r.checkStreams(ctx)
	case redis.Unrecoverable(err):
		return err
	case ctx.Err() == nil:
		r.log.Warn("checking the Redis user's permissions failed; running without the check", "err", err)
	}
	return nil
}

// checkStreams ends the run at start when a key the run reads or writes as a stream holds
// something else: another application's data where the pipeline writes (a key_prefix shared by
// mistake, a sink's stream name taken), which would fail every commit that touches it, after its
// inputs were acknowledged on a single server. A check that cannot run leaves the run to find out.
func (r *accessCheck) checkStreams(ctx context.Context) error {
	keys := r.streamKeys()
	types, err := r.rdb.KeyTypes(ctx, keys)
	if err != nil {
		if redis.Unrecoverable(err) {
			return err
		}
		r.log.Debug("checking the types of the pipeline's streams failed; running without the check", "err", err)
		return nil
	}
	for i, t := range types {
		if t != "none" && t != "stream" {
			return fmt.Errorf("the key %s holds a %s, not a stream: the pipeline would read or write it as one. "+
				"Another application's data is where the pipeline keeps its streams: give the pipeline another key_prefix "+
				"(or the sink another stream), or remove the key", keys[i], t)
		}
	}
	return nil
}

// streamKeys lists the streams that this process's run reads or writes.
func (r *accessCheck) streamKeys() []string {
	seen := map[string]bool{}
	var keys []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	for _, u := range r.units {
		add(u.stream)
	}
	for _, n := range r.nodes {
		add(r.keys.DeadLetter(n.name))
		if !r.producing(n) {
			for _, o := range r.committedOutputs(n) {
				add(o.stream)
			}
		}
	}
	for _, p := range r.producers {
		for _, s := range r.streams[p.output.Name] {
			add(s)
		}
	}
	return keys
}

// accessChecks lists what this process will send when it runs its part of the plan: per
// consuming unit its group, lease, retry set and the streams its node writes; per producing
// source its lease and output; the membership; the trimming of retained topics.
func (r *accessCheck) accessChecks() *redis.Access {
	a := redis.NewAccess(r.keys)
	a.Members("the membership of the running processes", r.keys.Members())
	for _, n := range r.nodes {
		a.Members("the membership of the running processes", r.keys.NodeMembers(n.name))
	}
	for _, u := range r.units {
		r.unitAccess(a, u)
	}
	r.resumedAccess(a)
	r.statePartitionsAccess(a)
	r.outputsAccess(a)
	r.marksAccess(a)
	for _, p := range r.producers {
		r.producerAccess(a, p)
	}
	r.backlogAccess(a)
	r.retentionAccess(a)
	r.tablesAccess(a)
	// Last, so that a refusal names what the run needs a key for before the check itself.
	for _, k := range r.streamKeys() {
		a.Type("the check of the streams' types", k)
	}
	return a
}

// unitAccess lists what a consuming unit sends: its group, its commit (settle, and the one script
// of an effectively-once commit on a single server), its lease, retry set, watermarks and holds.
func (r *accessCheck) unitAccess(a *redis.Access, u *unit) {
	n := u.node
	who := n.typ + " " + n.name
	a.Consume(who, u.stream, n.group)
	if r.owned(u.stream) {
		a.Fetch(who, u.stream)
	}
	// Checked before the ack: the markers of effectively-once outputs, the types of the others.
	var markers, streams []string
	for _, o := range r.committedOutputs(n) {
		if o.dedup != "" {
			markers = append(markers, o.dedup)
		} else {
			streams = append(streams, o.stream)
			markers = r.payloadGuard(markers, o)
		}
	}
	var state redis.StateKeys
	if n.stateful {
		state = redis.StateKeys{Hash: r.keys.State(n.input.Name, u.partition, n.name), Timers: r.keys.Timers(n.input.Name, u.partition, n.name),
			Holds: r.keys.Holds(n.input.Name, u.partition, n.name)}
		a.State(who, state.Hash, state.Timers)
	}
	a.Settle(who, u.stream, n.group, u.retryKey, u.leaseKey, state, markers, streams)
	if n.delivery == flow.EffectivelyOnce && u.leaseKey != "" && !r.rdb.IsCluster() {
		// Its effectively-once commits are one script without markers (redis.Commit).
		var outputs, marks []string
		for _, o := range r.committedOutputs(n) {
			outputs = append(outputs, o.stream)
		}
		if spec := r.timeSpec(u); spec != nil {
			for _, o := range spec.Outputs {
				marks = append(marks, o.Hashes...)
			}
			marks = append(marks, spec.Close.Hash)
		}
		a.CommitOnce(who, u.stream, n.group, u.retryKey, u.leaseKey, state, outputs, marks)
	}
	a.Stats(who, u.stream)
	if u.leaseKey != "" {
		a.Lease(who, u.leaseKey)
	}
	if u.retryKey != "" {
		a.Retries(who, u.retryKey)
	}
	if spec := r.timeSpec(u); spec != nil {
		if spec.Marks != "" {
			a.ReadMarks(who, spec.Marks, u.stream)
		}
		for _, o := range spec.Outputs {
			for _, h := range o.Hashes {
				a.WriteMarks(who, h)
			}
		}
	}
	if n.stateful {
		a.Holds(who, r.keys.Holds(n.input.Name, u.partition, n.name))
	}
}

// tablesAccess lists what the lookup stages of this process send to their tables: the reads of
// rows in every partition's state hash, and the catch-up's questions to each stage of the table's
// chain (tables.go).
func (r *accessCheck) tablesAccess(a *redis.Access) {
	for _, n := range r.nodes {
		c := n.catchUp
		if c == nil {
			continue
		}
		who := n.typ + " " + n.name
		last := c.hops[len(c.hops)-1]
		for p := 0; p < last.partitions; p++ {
			a.TableRead(who, r.keys.State(last.topic, p, last.group))
		}
		for _, h := range c.hops {
			for _, s := range r.keys.Streams(h.topic, h.partitions) {
				a.GroupProgress(who, s, h.group)
			}
		}
	}
}

// resumedAccess lists the links of fused stages, checked for entries left from a run without
// fusion (fuseChains).
func (r *accessCheck) resumedAccess(a *redis.Access) {
	for _, n := range r.nodes {
		if n.resumeAs == "" {
			continue
		}
		for p := 0; p < n.input.Partitions; p++ {
			a.Stats(n.typ+" "+n.name, r.keys.Stream(n.input.Name, p))
			a.Retries(n.typ+" "+n.name, r.keys.Retry(n.input.Name, p, n.name))
		}
	}
}

// statePartitionsAccess lists the check of each stateful stage's partition count at start
// (state_partitions.go).
func (r *accessCheck) statePartitionsAccess(a *redis.Access) {
	for _, n := range r.nodes {
		if !n.stateful {
			continue
		}
		var hashes, timers []string
		for p := 0; p < n.input.Partitions; p++ {
			hashes, timers = append(hashes, r.keys.State(n.input.Name, p, n.name)), append(timers, r.keys.Timers(n.input.Name, p, n.name))
		}
		a.StatePartitions(n.typ+" "+n.name, r.keys.StatePartitions(n.input.Name, n.name), hashes, timers)
		if slices.Contains(r.resetState, n.name) {
			var state []string
			for p := 0; p < n.input.Partitions; p++ {
				state = append(state, hashes[p], timers[p], r.keys.Holds(n.input.Name, p, n.name))
			}
			a.StateFingerprint(n.typ+" "+n.name, r.keys.StateFingerprint(n.input.Name, n.name), state)
		} else {
			a.StateFingerprint(n.typ+" "+n.name, r.keys.StateFingerprint(n.input.Name, n.name), nil)
		}
	}
}

// outputsAccess lists each node's dead-letter stream and, for a consuming node, what its commits
// write.
func (r *accessCheck) outputsAccess(a *redis.Access) {
	for _, n := range r.nodes {
		who := n.typ + " " + n.name
		a.Len(who, r.keys.DeadLetter(n.name))
		if r.producing(n) {
			continue
		}
		for _, o := range r.committedOutputs(n) {
			a.Output(who, o.stream, o.dedup)
			r.offloadAccess(a, who, o)
		}
	}
}

// offloadAccess lists what writing an output with its payload offloaded sends, when the pipeline
// offloads payloads and the output may be offloaded.
func (r *accessCheck) offloadAccess(a *redis.Access, who string, o accessOutput) {
	if r.offloads(o) {
		a.Offload(who, o.stream)
	}
}

// offloads reports whether an output's payload may be offloaded: the pipeline offloads payloads,
// and the output goes to one of its streams.
func (r *accessCheck) offloads(o accessOutput) bool {
	return r.plan.OffloadOver > 0 && !o.inline && r.owned(o.stream)
}

// payloadGuard adds to the keys that a settle or checkpoint checks exist the payload key of a
// plain output that may be offloaded: the commit acks only once its script wrote the payload.
func (r *accessCheck) payloadGuard(guards []string, o accessOutput) []string {
	if !r.offloads(o) {
		return guards
	}
	return append(guards, redis.PayloadKey(o.stream, "token"))
}

// owned reports whether a stream is one of the pipeline's, under its key prefix: only those have
// offloaded payloads (a sink writes payloads inline into the streams of other applications).
func (r *accessCheck) owned(stream string) bool { return strings.HasPrefix(stream, r.keys.Prefix+":") }

// marksAccess lists the topics' watermarks, reopened at start, and those a job's end test reads.
func (r *accessCheck) marksAccess(a *redis.Access) {
	for _, h := range markHashes(r.keys, r.nodes, outputsOf(r.producers)) {
		a.WriteMarks("the watermarks of the pipeline's topics, reopened at start", h)
	}
	for _, u := range r.units { // a job's end test
		if u.node.timed() {
			a.ReadMarkField("the end of a job", closeMarkOf(r.keys, u).Hash)
		}
	}
	for _, p := range r.producers {
		if p.time != nil {
			a.ReadMarkField("the end of a job", p.time.hashes[0])
		}
	}
}

// producerAccess lists what a producing source sends: its lease, watermarks, outputs, dead
// letters, upstream lag and checkpoint.
func (r *accessCheck) producerAccess(a *redis.Access, p *producingSource) {
	who := "source " + p.node.name
	if p.leaseKey != "" {
		a.Lease(who, p.leaseKey)
	}
	if p.time != nil {
		a.ReadMarks(who, p.time.hashes[0], r.keys.Stream(p.output.Name, 0))
		for _, h := range p.time.hashes {
			a.WriteMarks(who, h)
		}
	}
	var markers []string
	streams := []string{r.keys.DeadLetter(p.node.name)}
	for i, s := range r.streams[p.output.Name] {
		dedup := ""
		if p.node.delivery == flow.EffectivelyOnce {
			dedup = r.keys.Dedup(p.output.Name, i, p.node.name, p.node.name, 0, "epoch:1", 0)
			markers = append(markers, dedup)
		} else {
			streams = append(streams, s)
			markers = r.payloadGuard(markers, accessOutput{stream: s})
		}
		a.Output(who, s, dedup)
		r.offloadAccess(a, who, accessOutput{stream: s})
	}
	deadLetters := accessOutput{stream: r.keys.DeadLetter(p.node.name)}
	markers = r.payloadGuard(markers, deadLetters)
	a.Output(who, deadLetters.stream, "")
	r.offloadAccess(a, who, deadLetters)
	a.UpstreamLag(who, r.keys.SourceUpstreamLag(p.node.name))
	if p.positionKey != "" {
		a.Checkpoint(who, p.positionKey, p.leaseKey, markers, streams)
	}
}

// backlogAccess lists the backlogs that writers into a topic with a max_lag measure.
func (r *accessCheck) backlogAccess(a *redis.Access) {
	for _, n := range r.nodes {
		for _, e := range r.plan.Edges {
			if e.From != n.typ+"."+n.name || !e.Writes() {
				continue
			}
			for _, s := range r.streams[strings.TrimPrefix(e.To, "topic.")] {
				if r.backpressure.Gate(s) != nil {
					a.Backlog(n.typ+" "+n.name+" (max_lag)", s)
				}
			}
		}
	}
}

// retentionAccess lists the trimming of retained topics, and the groups it reads to trim no
// further than they have read.
func (r *accessCheck) retentionAccess(a *redis.Access) {
	if !hasRetention(r.plan) {
		return
	}
	groups := readers(r.plan)
	for _, t := range r.plan.Topics {
		if t.Retention.MaxLen == 0 && t.Retention.MaxAge == 0 {
			continue
		}
		for _, s := range r.streams[t.Name] {
			for _, g := range groups[t.Name] {
				a.Group("trimming topic "+t.Name, s, g)
			}
			a.Trim("trimming topic "+t.Name, s)
		}
	}
}

// producing reports whether n is a source that produces (generate, file, stdin): it writes
// through its source writer, whose outputs accessChecks lists with the source.
func (r *accessCheck) producing(n *node) bool {
	for _, p := range r.producers {
		if p.node == n {
			return true
		}
	}
	return false
}

// accessOutput is a stream that a node's commits write, with a representative dedup marker
// when the node is effectively-once ("" otherwise).
type accessOutput struct {
	stream, dedup string
	inline        bool // a sink's stream, whose payloads are never offloaded
}

// committedOutputs lists the streams that a consuming node's commits may write: every partition
// of its output topics (side outputs included, such as an aggregate's late topic), a redis_stream
// sink's stream, its dead-letter topic's partitions, and its own dead-letter stream (also the
// fallback of a dead-letter topic whose key fails).
func (r *accessCheck) committedOutputs(n *node) []accessOutput {
	if n.chain != nil && n.chain.nodes[0] == n {
		// A chain's commits write what each of its stages writes, its dead letters included, and
		// the inputs of the stages after the first, where a retry for an unfused stage goes (handOn).
		var outs []accessOutput
		for _, m := range n.chain.nodes {
			outs = append(outs, r.nodeOutputs(m)...)
		}
		return outs
	}
	return r.nodeOutputs(n)
}

// nodeOutputs is committedOutputs of a node that runs in a hop of its own.
func (r *accessCheck) nodeOutputs(n *node) []accessOutput {
	var outs []accessOutput
	once := n.delivery == flow.EffectivelyOnce
	from := n.typ + "." + n.name
	for _, e := range r.plan.Edges {
		if e.From != from || !e.Writes() {
			continue
		}
		t := r.plan.Topic(strings.TrimPrefix(e.To, "topic."))
		if t == nil {
			continue
		}
		for p, s := range r.streams[t.Name] {
			o := accessOutput{stream: s}
			if once {
				o.dedup = r.keys.Dedup(t.Name, p, n.name, n.inputName(), 0, "0-0", 0)
			}
			outs = append(outs, o)
		}
	}
	if n.typ == "sink" {
		if h, ok := n.handler.(*sinkHandler); ok {
			for _, stream := range h.streams {
				o := accessOutput{stream: stream, inline: true}
				if once {
					o.dedup = r.keys.StreamDedup(stream, n.name, n.input.Name, 0, "0-0")
				}
				outs = append(outs, o)
			}
		}
	}
	if n.deadLetter != nil {
		for _, s := range r.streams[n.deadLetter.Name] {
			outs = append(outs, accessOutput{stream: s})
		}
	}
	return append(outs, accessOutput{stream: r.keys.DeadLetter(n.name)})
}
