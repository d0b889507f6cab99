package runtime

import (
	"cmp"
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// Metrics, through the OpenTelemetry metrics API (flowrun run exports them for Prometheus). Counters
// of messages are read from the nodes' own counters when metrics are collected, and lag, pending,
// retries, dead letters and watermarks come from the timed poll of the streams (a watermark's lag is
// measured on the runtime's clock when collected): the only per-message cost is two histogram
// records, and none without a MeterProvider.

// metrics holds the instruments recorded per message.
type metrics struct {
	duration metric.Float64Histogram // time to process a message, all attempts
	age      metric.Float64Histogram // time from the entry's write to its input until processing starts
}

// latencyBuckets suit both sub-millisecond processing and slow retries, in seconds.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// registerMetrics creates the run's instruments. Without a MeterProvider it does nothing.
func (r *runner) registerMetrics() error {
	if r.opts.MeterProvider == nil {
		return nil
	}
	m := r.opts.MeterProvider.Meter("github.com/flowrun/flowrun/runtime")
	var err error
	if r.metrics.duration, err = m.Float64Histogram("flowrun.message.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a source, stage or sink took to process a message, all attempts included."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return err
	}
	if r.metrics.age, err = m.Float64Histogram("flowrun.message.age", metric.WithUnit("s"),
		metric.WithDescription("Time from a message's entry being written to a node's input until the node processes it (at a sink: the latency of the last hop)."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return err
	}

	// The outcomes of the messages add up per node (outcomes.go): in = out + filtered + dropped +
	// absorbed + dead_lettered + in_flight, at every collection. The rest are no outcomes.
	counters := []struct {
		name, unit, desc string
		read             func(*counts, *nodeStats) int64
	}{
		{"flowrun.messages.in", "{message}", "Messages a node took in: entries read (a producing source: messages it produced). Each ends in one outcome: out, filtered, dropped, absorbed or dead_lettered, or is in flight.", func(c *counts, _ *nodeStats) int64 { return c.in }},
		{"flowrun.messages.out", "{message}", "Messages a node passed on: that produced at least one output (a sink: delivered; a source: written).", func(c *counts, _ *nodeStats) int64 { return c.out }},
		{"flowrun.messages.filtered", "{message}", "Messages that produced nothing, by design (a filter, a route without default, a sink's where).", func(c *counts, _ *nodeStats) int64 { return c.filtered }},
		{"flowrun.messages.dropped", "{message}", "Late or repeated messages a stateful stage passed on nowhere (late or duplicates = \"drop\").", func(c *counts, _ *nodeStats) int64 { return c.dropped }},
		{"flowrun.messages.absorbed", "{message}", "Messages a windowed stage (an aggregate) took into its windows, whose results its timers emit.", func(c *counts, _ *nodeStats) int64 { return c.absorbed }},
		{"flowrun.messages.dead_lettered", "{message}", "Messages that failed for good or could not be read, sent to a dead-letter stream (a source: rejected).", func(c *counts, _ *nodeStats) int64 { return c.deadLettered }},
		{"flowrun.messages.late", "{message}", "Messages a stateful stage found late (an aggregate's, for closed windows), routed, dead-lettered or dropped.", func(c *counts, _ *nodeStats) int64 { return c.late }},
		{"flowrun.messages.duplicates", "{message}", "Messages a stateful stage found repeated (a dedupe's), routed or dropped.", func(c *counts, _ *nodeStats) int64 { return c.duplicates }},
		{"flowrun.entries.written", "{entry}", "Entries a node wrote to topics and streams, dead letters aside (a fan-out's several per message, an aggregate's results; a sink: its deliveries). Not an outcome of a message.", func(c *counts, _ *nodeStats) int64 { return c.written }},
		{"flowrun.attempts.failed", "{attempt}", "Attempts at a message that failed.", func(_ *counts, s *nodeStats) int64 { return s.failedAttempts.Load() }},
		{"flowrun.retries", "{attempt}", "Attempts made again after a failure.", func(_ *counts, s *nodeStats) int64 { return s.retries.Load() }},
	}
	var observables []metric.Observable
	type observedCounter struct {
		inst metric.Int64ObservableCounter
		read func(*counts, *nodeStats) int64
	}
	var observed []observedCounter
	for _, c := range counters {
		inst, err := m.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc))
		if err != nil {
			return err
		}
		observed = append(observed, observedCounter{inst, c.read})
		observables = append(observables, inst)
	}
	inFlight, err := m.Int64ObservableUpDownCounter("flowrun.messages.in_flight", metric.WithUnit("{message}"),
		metric.WithDescription("Messages a node took in and has not settled: waiting in its retry set for a later attempt."))
	if err != nil {
		return err
	}
	observables = append(observables, inFlight)
	lag, err := m.Int64ObservableGauge("flowrun.partition.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Entries of an input partition (or of a redis_stream source's stream) not yet delivered to the node."))
	if err != nil {
		return err
	}
	pending, err := m.Int64ObservableGauge("flowrun.partition.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Entries of an input partition (or of a redis_stream source's stream) delivered to the node and not yet acknowledged."))
	if err != nil {
		return err
	}
	retries, err := m.Int64ObservableGauge("flowrun.partition.retries", metric.WithUnit("{message}"),
		metric.WithDescription("Messages of an input partition waiting in the stage's or sink's retry set."))
	if err != nil {
		return err
	}
	dead, err := m.Int64ObservableGauge("flowrun.dead_letters", metric.WithUnit("{message}"),
		metric.WithDescription("Entries in a node's own dead-letter stream."))
	if err != nil {
		return err
	}
	leases, err := m.Int64ObservableGauge("flowrun.leases.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Partition leases this process holds."))
	if err != nil {
		return err
	}
	paused, err := m.Int64ObservableGauge("flowrun.node.paused",
		metric.WithDescription("1 while a stage's or sink's attempts fail transiently and it waits for its downstream to come back (one probe at a time), else 0."))
	if err != nil {
		return err
	}
	heldBack, err := m.Float64ObservableCounter("flowrun.node.held_back", metric.WithUnit("s"),
		metric.WithDescription("Time a node's writers waited for topics at their max_lag (backpressure)."))
	if err != nil {
		return err
	}
	redisDown, err := m.Int64ObservableGauge("flowrun.redis.failing",
		metric.WithDescription("1 while this process's calls to Redis fail (it waits and retries), else 0."))
	if err != nil {
		return err
	}
	watermarkLag, err := m.Float64ObservableGauge("flowrun.watermark.lag", metric.WithUnit("s"),
		metric.WithDescription("The clock less a stateful stage's own watermark in an input partition (event time): how far event time there is behind. None before the partition has a watermark."))
	if err != nil {
		return err
	}
	observables = append(observables, lag, pending, retries, dead, leases, paused, heldBack, redisDown, watermarkLag)

	nodeAttrs := map[string]metric.MeasurementOption{}
	for _, n := range r.nodes {
		nodeAttrs[n.name] = metric.WithAttributeSet(attribute.NewSet(
			attribute.String("flowrun.node", n.name), attribute.String("flowrun.node.type", n.typ),
			attribute.String("flowrun.node.kind", n.kind)))
		n.metricAttrs = nodeAttrs[n.name]
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, n := range r.nodes {
			counted := n.stats.counts()
			for _, c := range observed {
				o.ObserveInt64(c.inst, c.read(&counted, &n.stats), nodeAttrs[n.name])
			}
			o.ObserveInt64(inFlight, counted.inFlight(), nodeAttrs[n.name])
			o.ObserveFloat64(heldBack, time.Duration(n.stats.heldBack.Load()).Seconds(), nodeAttrs[n.name])
			if n.typ != "source" {
				_, _, open := n.breaker.pausedSince()
				o.ObserveInt64(paused, boolGauge(open), nodeAttrs[n.name])
			}
		}
		_, failing := r.outage.failing()
		o.ObserveInt64(redisDown, boolGauge(failing))
		r.poll.mu.Lock()
		parts, deadLetters := r.poll.partitions, r.poll.deadLetters
		r.poll.mu.Unlock()
		now := r.clock.Now()
		for _, p := range parts {
			// A redis_stream source reads a stream of no topic: the stream names it.
			attrs := metric.WithAttributes(attribute.String("flowrun.node", p.Node),
				attribute.String("messaging.destination.name", cmp.Or(p.Topic, p.Stream)),
				attribute.String("messaging.destination.partition.id", strconv.Itoa(p.Partition)))
			o.ObserveInt64(lag, p.Lag, attrs)
			o.ObserveInt64(pending, p.Pending, attrs)
			o.ObserveInt64(retries, p.Retries, attrs)
			if !p.Watermark.IsZero() {
				o.ObserveFloat64(watermarkLag, now.Sub(p.Watermark).Seconds(), attrs)
			}
		}
		for name, length := range deadLetters {
			o.ObserveInt64(dead, length, nodeAttrs[name])
		}
		if own := r.own.Load(); own != nil {
			held, _ := own.holdings()
			o.ObserveInt64(leases, int64(held))
		}
		return nil
	}, observables...)
	return err
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// recordMessage records the processing time of a message and its age when processing started.
func (r *runner) recordMessage(n *node, m *message, started time.Time) {
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
