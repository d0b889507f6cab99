package runtime

import (
	"context"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A source whose kind reads a Redis stream that other applications write (a stages.StreamSource)
// reads it through a consumer group of its own, and passes each entry to its output topic. It is a
// consuming node with a single unit, leased so that one process reads the stream in order; the group
// remembers where it stopped, so a restart resumes there. An entry with a payload field is that
// JSON; any other entry is an object of its fields (transport/redis DecodeEntry).

// streamSourceHandler passes entries of an external stream to the source's output topic.
type streamSourceHandler struct {
	noLifecycle
	r      *processing
	node   *node
	out    *flow.Topic
	spread sourceSpread
}

func (h *streamSourceHandler) handle(_ context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	out, err := h.r.topicOutput(h.node, m, h.out, &m.msg, 0, h.spread.next(m.id))
	if err != nil {
		return outs, err
	}
	return append(outs, out), nil
}
