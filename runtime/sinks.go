package runtime

import (
	"context"
	"strconv"
	"sync"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A sink is a consuming node that hands each message to its kind's stages.Sink. Sinks keep the order
// of each key and work on up to their kind's lanes of a partition at once; an attempt may take
// stages.DefaultSinkTimeout, or the sink's own timeout when it has one (stages.Timeouter).

// sinkHandler applies a sink's where and delivers what passes.
type sinkHandler struct {
	lifecycle // the sink's
	r         *processing
	node      *node
	where     *expr.Program
	sink      stages.Sink
	batch     stages.BatchSink // the sink, when it takes batches; nil otherwise
	streams   []string         // the streams its writes go to (SinkKind.Streams), for the access check
}

func (h *sinkHandler) handle(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	if m.batched { // its first attempt was made with its batch (deliverBatch)
		m.batched = false
		if m.batchErr == nil {
			m.outcome = outcomeDelivered
		}
		return outs, m.batchErr
	}
	if h.where != nil {
		ok, err := stages.Holds(h.where, &m.msg)
		if err != nil {
			return outs, err
		}
		if !ok {
			m.outcome = outcomeFiltered
			return outs, nil
		}
	}
	if h.batch != nil {
		err := h.deliverOne(ctx, m)
		if err == nil && m.away != nil {
			h.deliverRest(m) // the sink is back: the rest of the batch goes as a batch again
		}
		m.away = nil
		return outs, err
	}
	return h.deliver(ctx, m, outs)
}

// deliverBatch makes the first attempt at a batch's messages at once, for a sink that takes
// batches (stages.BatchSink), before they go through the node's layers one by one: each message's
// first attempt then takes its result (handle), and the layers retry, dead-letter and count it as
// they do any attempt. Entries that the poison check fails unprocessed, and messages that where
// filters out, are left to their own attempts.
//
// A transient result is not taken: the sink is away, and those messages make their first attempts
// one at a time, as the node's breaker lets them probe, so that the sink is not paused again by
// each of a batch's stale failures; a paused sink takes no batch at all. Once one of them is
// delivered, the sink is back, and the messages after it make their first attempts as a batch
// again (deliverRest): a sink that processes a partition's messages in order (Inline) only, since
// lanes may have started some of them.
func (h *sinkHandler) deliverBatch(ctx context.Context, msgs []*message) {
	if h.batch == nil || len(msgs) < 2 {
		return
	}
	of := make([]*message, 0, len(msgs))
	for _, m := range msgs {
		if m.deliveries > poisonDeliveries {
			continue
		}
		if h.where != nil {
			if ok, err := stages.Holds(h.where, &m.msg); err != nil || !ok {
				continue
			}
		}
		of = append(of, m)
	}
	if len(of) < 2 {
		return
	}
	if h.node.breaker != nil {
		if _, _, paused := h.node.breaker.pausedSince(); paused {
			h.wait(of)
			return
		}
	}
	h.deliverSome(ctx, of)
}

// deliverSome delivers messages as a batch and gives each the result of its first attempt, but
// for those that failed transiently, which wait (see deliverBatch).
func (h *sinkHandler) deliverSome(ctx context.Context, of []*message) {
	batch := make([]stages.Delivery, len(of))
	for i, m := range of {
		// The trace context the entry came with: the attempt's span, a child of it, starts once
		// the batch's results are taken.
		batch[i] = stages.Delivery{Message: &m.msg, ID: m.id, Partition: m.partition, Traceparent: m.trace.parent, Tracestate: m.trace.state,
			Redelivered: m.redelivered || m.attempts > 0}
	}
	ctx, cancel := context.WithTimeout(ctx, h.node.timeout)
	defer cancel()
	h.batch.DeliverBatch(ctx, batch)
	var waiting []*message
	for i, d := range batch {
		of[i].away = nil
		if d.Err == nil || !stages.IsTransient(d.Err) {
			of[i].batched, of[i].batchErr = true, d.Err
			continue
		}
		waiting = append(waiting, of[i])
	}
	h.wait(waiting)
}

// wait marks messages that make their first attempts one at a time while the sink is away, until
// one of them is delivered: those after it then go as a batch (deliverRest).
func (h *sinkHandler) wait(msgs []*message) {
	if !h.node.inline || len(msgs) < 2 {
		return
	}
	b := &sinkBatch{msgs: msgs}
	for i, m := range msgs {
		m.away, m.awayAt = b, i
	}
}

// deliverRest delivers, as a batch, the messages that waited with m and come after it.
func (h *sinkHandler) deliverRest(m *message) {
	var rest []*message
	for _, later := range m.away.msgs[m.awayAt+1:] {
		if later.away == m.away && !later.batched {
			rest = append(rest, later)
		}
	}
	if len(rest) >= 2 {
		h.deliverSome(h.r.hard, rest)
	}
}

// sinkBatch is the messages of a batch that wait while the sink is away (deliverBatch).
type sinkBatch struct{ msgs []*message }

// deliverOne is an attempt at one message through a sink that takes batches: a batch of one.
func (h *sinkHandler) deliverOne(ctx context.Context, m *message) error {
	if m.out.parent != "" {
		ctx = stages.ContextWithTrace(ctx, m.out.parent, m.out.state)
	}
	batch := []stages.Delivery{{Message: &m.msg, ID: m.id, Partition: m.partition, Traceparent: m.out.parent, Tracestate: m.out.state,
		Redelivered: m.redelivered || m.attempts > 0}}
	h.batch.DeliverBatch(ctx, batch)
	if batch[0].Err == nil {
		m.outcome = outcomeDelivered
	}
	return batch[0].Err
}

// deliver delivers a message through the sink. A delivered message is the sink's out, counted
// when its batch commits (outcomes.go), once: a batch delivered again because its flush or its
// commit failed delivers its messages again (the outside world sees them twice: at-least-once), but
// counts them once. The writes of a sink that writes to Redis go to outs, which the commit writes.
func (h *sinkHandler) deliver(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	if m.out.parent != "" {
		ctx = stages.ContextWithTrace(ctx, m.out.parent, m.out.state)
	}
	scratch := sinkWrites.Get().(*[]stages.Write)
	defer func() {
		clear(*scratch)
		*scratch = (*scratch)[:0]
		sinkWrites.Put(scratch)
	}()
	writes, err := h.sink.Deliver(ctx, &m.msg, *scratch)
	*scratch = writes
	if err != nil {
		return outs, err
	}
	if len(writes) == 0 {
		m.outcome = outcomeDelivered
		return outs, nil
	}
	for i, w := range writes {
		e, err := entryOf(w.Message.Key, w.Message, m.out)
		if err != nil {
			return outs, err
		}
		// Inline: the applications that read the stream expect a payload field.
		out := redis.Output{Stream: w.Stream, Entry: e, MaxLen: w.MaxLen, Inline: true}
		if h.node.delivery == flow.EffectivelyOnce {
			id := m.id
			if i > 0 {
				id += "/" + strconv.Itoa(i)
			}
			out.DedupKey = h.r.keys.StreamDedup(w.Stream, h.node.name, h.node.input.Name, m.partition, id)
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// sinkWrites recycles the slices that sinks append their writes to.
var sinkWrites = sync.Pool{New: func() any { s := make([]stages.Write, 0, 1); return &s }}
