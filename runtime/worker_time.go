package runtime

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A unit that feeds a stateful stage, or is one, keeps its input partition's watermarks and passes
// them on with its commits (package runtime/state has the how, flow/watermarks.go the rule). This
// file wires it into the worker: the Spec of a unit, the steps of a batch that touch the
// watermarks, and the turns of an idle unit.

// timeSpec returns the watermark spec of a unit; nil for a unit that keeps none.
func (r *runner) timeSpec(u *unit) *state.Spec {
	n := u.node
	var spec *state.Spec
	switch {
	case n.stage != nil && n.stage.Watermark != nil:
		sw := n.stage.Watermark
		spec = &state.Spec{Domains: sw.Domains, Own: sw.Own, Measures: sw.Measures, IdleTimeout: sw.IdleTimeout}
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
	spec.Close = closeMarkOf(r, u)
	if spec.Measures {
		spec.Carries = carriedDomains(spec)
	}
	return spec
}

// carriedDomains are the domains whose watermarks a measuring unit puts in the messages it passes
// on (stages.WatermarkHeader): those its pass-through outputs need, but the entry's time, which
// never goes back where it is measured.
func carriedDomains(spec *state.Spec) []int {
	var out []int
	seen := map[int]bool{}
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
func closeMarkOf(r *runner, u *unit) state.CloseMark {
	n := u.node
	if n.input != nil {
		return state.CloseMark{Hash: r.keys.Watermarks(n.input.Name, u.partition), Field: redis.MarkField(n.typ+"."+n.name, "closed")}
	}
	return state.CloseMark{Hash: r.keys.Watermarks(n.source.Output.Name, 0), Field: redis.MarkField(n.typ+"."+n.name, "closed")}
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
func (r *runner) writesOf(n *node) []topicWrite {
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
func (r *runner) timeOutput(spec *state.Spec, tw topicWrite, p int) state.Output {
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

// stampsEntryTime reports whether a node that measures its input passes on messages whose event
// time is their entry's time (a later stateful stage has no event_time): the entry's time goes with
// them in a header (stages.EventTimeHeader), for the entry that carries them next has another.
func stampsEntryTime(spec *state.Spec) bool {
	if spec == nil || !spec.Measures {
		return false
	}
	for _, o := range spec.Outputs {
		if o.Results {
			continue
		}
		for _, name := range o.Names {
			if name == "" {
				return true
			}
		}
	}
	return false
}

// stampEntryTime puts the time of a message's entry in its headers, unless it carries one.
func stampEntryTime(m *stages.Message, id string) {
	if m.Headers[stages.EventTimeHeader] != "" {
		return
	}
	ms, err := redis.IDMillis(id)
	if err != nil {
		return
	}
	headers := make(map[string]string, len(m.Headers)+1)
	for k, v := range m.Headers {
		headers[k] = v
	}
	headers[stages.EventTimeHeader] = strconv.FormatInt(ms, 10)
	m.Headers = headers
}

// beginTime starts the watermarks' part of a batch of messages, once they have begun (Begin, in
// process): a followed input's writers are read, a measured one's event times observed. It returns each message's watermark for a stateful
// stage to judge it by.
func (w *worker) beginTime(ctx context.Context, msgs []*message, read bool) ([]int64, error) {
	wm := w.time
	if wm == nil {
		return nil, nil
	}
	if w.u.node.stateful {
		if err := wm.Load(ctx, w.r.rdb, w.stateKeys.Hash); err != nil {
			return nil, err
		}
	}
	if !wm.Measures() {
		if read {
			if err := wm.Follow(ctx, w.r.rdb); err != nil {
				w.u.node.log.Debug("cannot read the watermarks of the input's writers", "err", err)
			}
		}
		if !w.u.node.stateful {
			return nil, nil
		}
		own := make([]int64, len(msgs))
		for i := range own {
			own[i] = wm.Committed()
		}
		return w.carried(msgs, own), nil
	}
	sm := make([]*stages.Message, len(msgs))
	for i, m := range msgs {
		sm[i] = &m.msg
	}
	return w.carried(msgs, wm.Observe(sm)), nil
}

// carried raises each message's watermark to the one it carries from where it entered the
// pipeline (stages.WatermarkHeader): a stateful stage judges a message late by the later of the
// two, so that what is late does not depend on batches and processes on the way.
func (w *worker) carried(msgs []*message, own []int64) []int64 {
	if own == nil {
		return nil
	}
	domain := w.u.node.stage.Watermark.Domains[w.u.node.stage.Watermark.Own].Name
	for i, m := range msgs {
		own[i] = max(own[i], stages.CarriedWatermark(&m.msg, domain))
	}
	return own
}

// endTime ends the watermarks' part of a batch, once its timers have fired: a stateful stage's own
// watermark is written with its state when it moved, and the marks of what the unit writes go with
// the commit. timersLeft is the time of the earliest timer that is due but did not fire in this
// batch (0: none): what it will write is not written yet, so the watermark of the unit's results
// stays where that timer's result can be, and the unit does not close.
func (w *worker) endTime(ctx context.Context, st *state.Batch, timersLeft int64) ([]redis.MarkWrite, error) {
	wm := w.time
	if wm == nil {
		return nil, nil
	}
	n := w.u.node
	if st != nil && wm.Own() > wm.Committed() {
		st.SetWatermark(wm.Own())
	}
	if timersLeft > 0 {
		wm.KeepOpen()
	}
	var holdErr error
	marks := wm.Marks(func() int64 {
		own := wm.Own()
		if own <= 0 || n.outputWatermark == nil {
			return own
		}
		at := n.outputWatermark.OutputWatermark(time.UnixMilli(own)).UnixMilli()
		if timersLeft > 0 {
			at = min(at, n.outputWatermark.OutputWatermark(time.UnixMilli(timersLeft)).UnixMilli())
		}
		if st != nil {
			held, found, err := st.MinHold(ctx)
			if err != nil {
				holdErr = err
				return 0
			}
			if found {
				at = min(at, held)
			}
		}
		return at
	})
	return marks, holdErr
}

// timerWatermark is what the timers of a batch fire at: the unit's own watermark, or every timer
// when its input closed at a job's end (for kinds whose timers fire then).
func (w *worker) timerWatermark() int64 {
	if w.time.Closing() && w.u.node.fireAtEnd {
		return math.MaxInt64
	}
	return w.time.Own()
}

// idleTurn is a turn of a timed unit whose read found nothing: its watermarks may move (its writers
// moved theirs, it has been idle long enough, a job's input closed), and then the unit commits a
// batch without messages, firing the timers that became due and passing the watermarks on.
func (w *worker) idleTurn(ctx context.Context) error {
	if w.time == nil || w.recover {
		return nil
	}
	n := w.u.node
	w.time.Begin()
	changed, err := w.time.Idle(ctx, w.r.rdb, w.r.clock.Now(), w.r.closing.Load(), func() (bool, error) {
		if w.u.retryKey != "" {
			if _, waiting, err := w.r.rdb.NextRetry(ctx, w.u.retryKey); err != nil || waiting {
				return false, err // messages waiting for a retry hold the watermark back
			}
		}
		backlog, err := w.r.rdb.Backlog(ctx, w.u.stream, []string{n.group})
		return backlog == 0, err
	})
	if err != nil {
		n.log.Debug("cannot tell whether the watermarks move", "err", err)
		return nil
	}
	if !changed && !w.timersDue {
		return nil
	}
	return w.processBegun(ctx, redis.Batch{}, nil, nil)
}

// timeCommitted tells the watermarks that the batch is committed, and the drain of a job that the
// unit's input closed.
func (w *worker) timeCommitted() {
	if w.time == nil {
		return
	}
	wasClosed := w.time.Closed()
	w.time.Commit()
	if w.time.Closed() && !wasClosed {
		w.r.kickDrain()
		_ = w.r.rdb.UnblockReads(context.Background()) // the units after it may close now
	}
}

// markHashes are the watermarks hashes of every partition of the topics with watermarks that this
// process's nodes read or write.
func (r *runner) markHashes() []string {
	seen := map[string]bool{}
	var out []string
	add := func(t *flow.Topic) {
		if t == nil || t.Watermark == nil || seen[t.Name] {
			return
		}
		seen[t.Name] = true
		for p := range t.Partitions {
			out = append(out, r.keys.Watermarks(t.Name, p))
		}
	}
	for _, n := range r.nodes {
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
	for _, p := range r.producers {
		add(p.output)
	}
	return out
}

// reopenMarks takes back the closes that the end of an earlier job left in the watermarks (a
// closed writer counts as later than any time), before anything reads them: this run goes on
// from the watermarks as they were before.
func (r *runner) reopenMarks(ctx context.Context) error {
	hashes := r.markHashes()
	if len(hashes) == 0 {
		return nil
	}
	return r.rdb.ReopenMarks(ctx, hashes)
}
