package runtime

import (
	"context"
	"time"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// withMetrics records how long each message took, all attempts included, and how old its entry was
// when the node took it. Without a MeterProvider (the instruments are made when the run starts) it
// adds nothing, not even a clock reading.
func (r *processing) withMetrics(n *node, next messageFunc) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		if r.metrics.duration == nil {
			return next(ctx, m, buf, p)
		}
		started := r.clock.Now()
		res, buf, err := next(ctx, m, buf, p)
		r.recordMessage(n, m, started)
		return res, buf, err
	}
}

// recordMessage records the processing time of a message and its age when processing started.
func (r *processing) recordMessage(n *node, m *message, started time.Time) {
	if r.metrics.duration == nil {
		return
	}
	ctx := context.Background()
	r.metrics.duration.Record(ctx, r.clock.Now().Sub(started).Seconds(), n.metricAttrs)
	if written, ok := entryTime(m.id); ok {
		r.metrics.age.Record(ctx, started.Sub(written).Seconds(), n.metricAttrs)
	}
}
