package runtime

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// stageHandler runs a stage's processor and routes its outputs to their topics' partitions.
type stageHandler struct {
	lifecycle // the processor's, if it has one
	r         *processing
	node      *node
	proc      stages.Processor         // a stage that keeps no state
	stateful  stages.StatefulProcessor // or one that does
	// keepsKey, for a stage whose kind declares that it keeps keys (stages.StageTraits.KeepsKey,
	// and through it flow.Kind.KeepsKey, which fusion relies on), says who declared it and how to
	// undo it, for the error of an output that does not; nil for other stages.
	keepsKey *keyClaim
	// batchReader is proc, when it reads a batch's worth at once (stages.BatchReader).
	batchReader stages.BatchReader
}

// readBatch lets a stage that reads something from outside for each message read a batch's at
// once (stages.BatchReader), before any of the batch's messages is processed. A retry is left out:
// it reads anew. A failed read is no failure: each message then reads for itself.
func (h *stageHandler) readBatch(ctx context.Context, msgs []*message) {
	if h.batchReader == nil {
		return
	}
	batch := make([]*stages.Message, 0, len(msgs))
	for _, m := range msgs {
		if m.retry == nil && m.attempts == 0 {
			batch = append(batch, &m.msg)
		}
	}
	if len(batch) == 0 {
		return
	}
	read, err := h.batchReader.ReadBatch(ctx, batch)
	if err != nil {
		h.node.log.Debug("reading the batch's rows at once failed; each message reads its own", "err", err)
		return
	}
	for _, m := range msgs {
		if m.retry == nil && m.attempts == 0 {
			m.prefetched = read
		}
	}
}

func (h *stageHandler) handle(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	scratch := stageOutputs.Get().(*[]stages.Output)
	defer func() {
		clear(*scratch)
		*scratch = (*scratch)[:0]
		stageOutputs.Put(scratch)
	}()
	var results []stages.Output
	var err error
	dropped := "" // why a stateful stage passed the message on nowhere: "late" or "repeated"
	key := m.msg.Key
	if h.stateful != nil {
		results, dropped, err = h.attempt(ctx, m, *scratch)
	} else {
		if m.prefetched != nil {
			ctx = stages.WithBatched(ctx, m.prefetched)
		}
		results, err = h.proc.Process(ctx, &m.msg, *scratch)
	}
	*scratch = results
	if err != nil {
		return outs, err
	}
	if h.keepsKey != nil {
		if err := h.keepsKey.check(key, results); err != nil {
			return outs, err
		}
	}
	if passedOn(results) == 0 {
		// What became of a message that passed nothing on (outcomes.go): a windowed kind
		// (FireAtEnd) holds its messages in windows, unless it dropped them (late = "drop"); one
		// dead-lettered for some of its windows is held in the others.
		switch {
		case dropped != "":
			m.outcome = outcomeDropped
			if h.r.dropped != nil {
				payload, _ := m.msg.Payload()
				h.r.dropped(h.node.name, m.msg.Key, payload, dropped)
			}
		case h.node.fireAtEnd || h.node.absorbs:
			m.outcome = outcomeAbsorbed
		default:
			m.outcome = outcomeFiltered
		}
	}
	for i := range results {
		o := &results[i]
		if o.DeadLetter != "" {
			m.deadLetters = append(m.deadLetters, h.r.deadLetterMessage(h.node, &message{id: m.id, path: m.path, partition: m.partition, msg: o.Message, out: m.out},
				errors.New(o.DeadLetter), m.attempts+1, h.r.clock.Now()))
			continue
		}
		out, err := h.r.topicOutput(h.node, m, o.Topic, &o.Message, i, m.partition)
		if err != nil {
			return outs, err
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// passedOn counts the outputs that go to topics, not to the dead letters.
func passedOn(results []stages.Output) int {
	n := 0
	for i := range results {
		if results[i].DeadLetter == "" {
			n++
		}
	}
	return n
}

// attempt runs one attempt of a stateful stage with a fresh view of its batch's state, and joins
// the view's writes to the batch when the attempt succeeds. It reports whether the attempt dropped
// its message, and why ("late" or "repeated"; "" when it did not): recorded it late or a duplicate
// and passed it on nowhere (late = "drop", duplicates = "drop"). An attempt that fails for good at once (a permanent error: the message is
// dead-lettered) counts its outcomes without its writes, so that a late message dead-lettered
// counts as late too.
func (h *stageHandler) attempt(ctx context.Context, m *message, out []stages.Output) ([]stages.Output, string, error) {
	a := m.state.Attempt(m.watermark)
	outs, err := h.stateful.Process(ctx, a, &m.msg, out)
	if err != nil {
		if stages.IsPermanent(err) {
			a.Failed()
		}
		return outs, "", err
	}
	// A kind that absorbs its messages into its state (a table) may keep one it counted late: it
	// is absorbed, not dropped.
	dropped := ""
	if len(outs) == 0 && a.Recorded() && !h.node.absorbs {
		dropped = "repeated"
		if a.RecordedLate() {
			dropped = "late"
		}
	}
	a.Join()
	return outs, dropped, nil
}

// keyClaim is a stage's declaration that its outputs keep the key of the message they came from.
type keyClaim struct {
	who  string // who declares it: `the Go stage function "acme.score" is registered with stages.KeepsKey`
	undo string // how to stop declaring it: "register it without KeepsKey"
}

// keyClaimOf returns the declaration that stage s keeps keys, nil when it makes none.
func keyClaimOf(s *flow.Stage, traits stages.StageTraits) *keyClaim {
	switch {
	case !traits.KeepsKey:
		return nil
	case s.Kind == "go":
		return &keyClaim{fmt.Sprintf("the Go stage function %q is registered with stages.KeepsKey", s.Config.String("func")),
			"register it without KeepsKey"}
	}
	return &keyClaim{fmt.Sprintf("stage kind %q declares KeepsKey in its traits", s.Kind), "leave KeepsKey out of its traits"}
}

// check holds a stage to the claim: an output whose key is not the input's, key, fails the message
// for good. A stage fused after it would otherwise see that key's messages in the lanes of the keys
// they came with, from several partitions at once.
func (c *keyClaim) check(key string, results []stages.Output) error {
	for i := range results {
		if k := results[i].Message.Key; k != key {
			return stages.Permanent(fmt.Errorf("%s, but changed a message's key from %s to %s: keep the key it got, or %s "+
				"(a stage fused after it relies on the claim)", c.who, quoteKey(key), quoteKey(k), c.undo))
		}
	}
	return nil
}

// quoteKey quotes a key for an error, cut short past 64 bytes.
func quoteKey(k string) string {
	if len(k) > 64 {
		return strconv.Quote(k[:64]) + "..."
	}
	return strconv.Quote(k)
}

// stageOutputs recycles the slices that processors append their outputs to.
var stageOutputs = sync.Pool{New: func() any { s := make([]stages.Output, 0, 4); return &s }}

// topicOutput makes the entry that writes msg, the i-th output of input m at node n, to topic t;
// fallback is the partition of an unkeyed message. Effectively-once nodes mark the output so that
// writing it again after a crash writes nothing.
func (r *processing) topicOutput(n *node, m *message, t *flow.Topic, msg *stages.Message, i, fallback int) (redis.Output, error) {
	if !m.validated(n, t, msg) {
		if err := validate(t, msg); err != nil {
			return redis.Output{}, err
		}
	}
	var key string
	var p int
	var err error
	if m.keptKey(n, t, msg) {
		key, p = msg.Key, redis.Partition(msg.Key, t.Partitions)
	} else if key, p, err = route(t, msg, fallback); err != nil {
		return redis.Output{}, err
	}
	e, err := entryOf(key, msg, m.out)
	if err != nil {
		return redis.Output{}, err
	}
	out := redis.Output{Stream: r.streamKey(t, p), Entry: e}
	if n.delivery == flow.EffectivelyOnce {
		out.DedupKey = r.keys.Dedup(t.Name, p, n.name, n.inputName(), m.partition, m.id+m.path, i)
	}
	return out, nil
}

// keptKey reports whether msg, an output of input m at node n, goes to topic t with the key it
// arrived with, which its route would compute again: t's key expression is the input topic's, and
// neither the payload it is computed from nor the key changed on the way (a filter, an identity
// map). The input's key was computed by that expression when the entry was written.
func (m *message) keptKey(n *node, t *flow.Topic, msg *stages.Message) bool {
	if t.Key == nil || n.input == nil || n.input.Key == nil || msg.Key == "" || msg.Key != m.inKey {
		return false
	}
	raw := msg.Unchanged()
	if len(raw) == 0 || len(raw) != len(m.inPayload) || &raw[0] != &m.inPayload[0] {
		return false
	}
	return t.Key.String() == n.input.Key.String()
}

// validated reports whether msg, an output of input m at node n, is known to satisfy topic t's
// schema without checking it again: it is the input's payload unchanged, and the input topic has the
// same schema, which its writer checked (a filter between two topics of one schema file).
func (m *message) validated(n *node, t *flow.Topic, msg *stages.Message) bool {
	if t.Schema == nil || n.input == nil || !n.input.Schema.SameAs(t.Schema) {
		return t.Schema == nil
	}
	raw := msg.Unchanged()
	return len(raw) > 0 && len(raw) == len(m.inPayload) && &raw[0] == &m.inPayload[0]
}

// streamKey returns the stream of a topic's partition.
func (r *processing) streamKey(t *flow.Topic, partition int) string {
	if keys := r.streams[t.Name]; partition < len(keys) {
		return keys[partition]
	}
	return r.keys.Stream(t.Name, partition)
}
