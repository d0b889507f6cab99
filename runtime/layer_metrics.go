package runtime

import (
	"context"
	"time"

	redis "github.com/flowrun/flowrun/transport/redis"
	"go.opentelemetry.io/otel/metric"
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

// metrics holds the instruments recorded per message.
type metrics struct {
	duration metric.Float64Histogram // time to process a message, all attempts
	age      metric.Float64Histogram // time from the entry's write to its input until processing starts
}

// latencyBuckets suit both sub-millisecond processing and slow retries, in seconds.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// newMetrics creates the instruments recorded per message.
func newMetrics(m metric.Meter) (metrics, error) {
	var ms metrics
	var err error
	if ms.duration, err = m.Float64Histogram("flowrun.message.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a source, stage or sink took to process a message, all attempts included."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return metrics{}, err
	}
	if ms.age, err = m.Float64Histogram("flowrun.message.age", metric.WithUnit("s"),
		metric.WithDescription("Time from a message's entry being written to a node's input until the node processes it (at a sink: the latency of the last hop)."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return metrics{}, err
	}
	return ms, nil
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

// entryTime reads the time a stream entry was written from its ID ("<ms>-<seq>").
func entryTime(id string) (time.Time, bool) {
	n, err := redis.IDMillis(id)
	if err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}
