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
	streams   []string // the streams its writes go to (SinkKind.Streams), for the access check
}

func (h *sinkHandler) handle(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
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
	return h.deliver(ctx, m, outs)
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
		out := redis.Output{Stream: w.Stream, Entry: e, MaxLen: w.MaxLen}
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
