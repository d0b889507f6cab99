package runtime

import (
	"context"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// deliver delivers a message through the sink and counts the delivery as the sink's out, so that
// a stdout, file or http sink reports what it delivered like a stage reports what it wrote. A sink
// that writes to Redis (redis_stream) appends its entry to outs instead, which the batch's commit
// counts when it is written: counting it here too would count it twice.
//
// A delivery is counted when it succeeds, before its batch is acknowledged: a batch that must be
// delivered again (its flush or its commit failed) delivers, and counts, its messages again, as
// the outside world sees them twice.
func (h *sinkHandler) deliver(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	before := len(outs)
	outs, err := h.sink.deliver(ctx, m, outs)
	if err == nil && len(outs) == before {
		h.node.stats.out.Add(1)
	}
	return outs, err
}
