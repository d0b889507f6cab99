package runtime

import (
	"cmp"
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metrics, through the OpenTelemetry metrics API (flowrun run exports them for Prometheus). Counters
// of messages are read from the nodes' own counters when metrics are collected, and lag, pending,
// retries, dead letters and watermarks come from the timed poll of the streams (a watermark's lag is
// measured on the runtime's clock when collected): the only per-message cost is two histogram
// observations (layer_metrics.go; kept by Histograms where the reader takes them), and none without
// a MeterProvider.

// collected is what the metrics' callback reads of the run when metrics are collected.
type collected struct {
	failing     bool             // Redis is failing
	partitions  []PartitionState // as last polled
	deadLetters map[string]int64 // as last polled, by node
	leases      int              // held by this process; -1 before the run holds any
	// upstreamLags are what the sources this process runs last reported of their upstream lag.
	upstreamLags []sourceLag
}

// sourceLag is a source's upstream lag (stages.Emitter.ReportLag).
type sourceLag struct {
	source string
	lag    int64
}

// registerMetrics creates the run's instruments, one family at a time, and the callback that
// observes them when metrics are collected (reading the run through collect). The per-message
// instruments go to p. Without a MeterProvider it does nothing.
func registerMetrics(mp metric.MeterProvider, local *Histograms, p *processing, nodes func() []*node, collect func() collected) error {
	if mp == nil {
		return nil
	}
	m := mp.Meter(meterName)
	var err error
	if p.metrics, err = newMetrics(m, local); err != nil {
		return err
	}
	perNode, err := newNodeInstruments(m)
	if err != nil {
		return err
	}
	parts, err := newPartitionInstruments(m)
	if err != nil {
		return err
	}
	proc, err := newProcessInstruments(m)
	if err != nil {
		return err
	}
	for _, n := range nodes() {
		setMetricAttrs(n)
	}
	observables := append(append(perNode.observables(), parts.observables()...), proc.observables()...)
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		current := nodes() // a reload changes them: the nodes it starts get their attributes first
		nodeAttrs := make(map[string]metric.MeasurementOption, len(current))
		for _, n := range current {
			nodeAttrs[n.name] = n.metricAttrs
		}
		perNode.observe(o, current, nodeAttrs)
		c := collect()
		parts.observe(o, c.partitions, p.clock.Now())
		proc.observe(o, c, nodeAttrs)
		return nil
	}, observables...)
	return err
}

// meterName is the instrumentation scope of the runtime's metrics.
const meterName = "github.com/flowrun/flowrun/runtime"

// metricAttrsOf is a node's attributes on its metrics.
func metricAttrsOf(n *node) metric.MeasurementOption {
	return metric.WithAttributeSet(nodeAttrSet(n))
}

// nodeAttrSet is the set of those attributes.
func nodeAttrSet(n *node) attribute.Set {
	return attribute.NewSet(attribute.String("flowrun.node", n.name), attribute.String("flowrun.node.type", n.typ),
		attribute.String("flowrun.node.kind", n.kind))
}

// nodeCounters are the counters observed per node. The outcomes of the messages add up per node
// (outcomes.go): in = out + filtered + dropped + absorbed + dead_lettered + in_flight, at every
// collection. The rest are no outcomes.
var nodeCounters = []struct {
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

type observedCounter struct {
	inst metric.Int64ObservableCounter
	read func(*counts, *nodeStats) int64
}

// nodeInstruments are observed per node: its counters, the messages it has in flight, whether it
// is paused and how long its writers were held back.
type nodeInstruments struct {
	counters []observedCounter
	inFlight metric.Int64ObservableUpDownCounter
	paused   metric.Int64ObservableGauge
	heldBack metric.Float64ObservableCounter
	delayed  metric.Float64ObservableCounter
}

func newNodeInstruments(m metric.Meter) (*nodeInstruments, error) {
	ni := &nodeInstruments{}
	for _, c := range nodeCounters {
		inst, err := m.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc))
		if err != nil {
			return nil, err
		}
		ni.counters = append(ni.counters, observedCounter{inst, c.read})
	}
	var err error
	if ni.inFlight, err = m.Int64ObservableUpDownCounter("flowrun.messages.in_flight", metric.WithUnit("{message}"),
		metric.WithDescription("Messages a node took in and has not settled: waiting in its retry set for a later attempt.")); err != nil {
		return nil, err
	}
	if ni.paused, err = m.Int64ObservableGauge("flowrun.node.paused",
		metric.WithDescription("1 while a stage's or sink's attempts fail transiently and it waits for its downstream to come back (one probe at a time), else 0.")); err != nil {
		return nil, err
	}
	if ni.heldBack, err = m.Float64ObservableCounter("flowrun.node.held_back", metric.WithUnit("s"),
		metric.WithDescription("Time a node's writers waited for topics at their max_lag (backpressure).")); err != nil {
		return nil, err
	}
	if ni.delayed, err = m.Float64ObservableCounter("flowrun.node.delayed", metric.WithUnit("s"),
		metric.WithDescription("Time a node's messages waited because its kind delayed them: a rate_limit stage's messages over their limit.")); err != nil {
		return nil, err
	}
	return ni, nil
}

func (ni *nodeInstruments) observables() []metric.Observable {
	var obs []metric.Observable
	for _, c := range ni.counters {
		obs = append(obs, c.inst)
	}
	return append(obs, ni.inFlight, ni.paused, ni.heldBack, ni.delayed)
}

func (ni *nodeInstruments) observe(o metric.Observer, nodes []*node, nodeAttrs map[string]metric.MeasurementOption) {
	for _, n := range nodes {
		counted := n.stats.counts()
		for _, c := range ni.counters {
			o.ObserveInt64(c.inst, c.read(&counted, &n.stats), nodeAttrs[n.name])
		}
		o.ObserveInt64(ni.inFlight, counted.inFlight(), nodeAttrs[n.name])
		o.ObserveFloat64(ni.heldBack, time.Duration(n.stats.heldBack.Load()).Seconds(), nodeAttrs[n.name])
		o.ObserveFloat64(ni.delayed, time.Duration(n.stats.delayed.Load()).Seconds(), nodeAttrs[n.name])
		if n.typ != "source" {
			_, _, open := n.breaker.pausedSince()
			o.ObserveInt64(ni.paused, boolGauge(open), nodeAttrs[n.name])
		}
	}
}

// partitionInstruments are observed per input partition, from the last poll of the streams.
type partitionInstruments struct {
	lag, pending, retries metric.Int64ObservableGauge
	watermarkLag          metric.Float64ObservableGauge
}

func newPartitionInstruments(m metric.Meter) (*partitionInstruments, error) {
	pi := &partitionInstruments{}
	var err error
	if pi.lag, err = m.Int64ObservableGauge("flowrun.partition.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Entries of an input partition (or of a redis_stream source's stream) not yet delivered to the node.")); err != nil {
		return nil, err
	}
	if pi.pending, err = m.Int64ObservableGauge("flowrun.partition.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Entries of an input partition (or of a redis_stream source's stream) delivered to the node and not yet acknowledged.")); err != nil {
		return nil, err
	}
	if pi.retries, err = m.Int64ObservableGauge("flowrun.partition.retries", metric.WithUnit("{message}"),
		metric.WithDescription("Messages of an input partition waiting in the stage's or sink's retry set.")); err != nil {
		return nil, err
	}
	if pi.watermarkLag, err = m.Float64ObservableGauge("flowrun.watermark.lag", metric.WithUnit("s"),
		metric.WithDescription("The clock less a stateful stage's own watermark in an input partition (event time): how far event time there is behind. None before the partition has a watermark.")); err != nil {
		return nil, err
	}
	return pi, nil
}

func (pi *partitionInstruments) observables() []metric.Observable {
	return []metric.Observable{pi.lag, pi.pending, pi.retries, pi.watermarkLag}
}

func (pi *partitionInstruments) observe(o metric.Observer, parts []PartitionState, now time.Time) {
	for _, p := range parts {
		// A redis_stream source reads a stream of no topic: the stream names it.
		attrs := metric.WithAttributes(attribute.String("flowrun.node", p.Node),
			attribute.String("messaging.destination.name", cmp.Or(p.Topic, p.Stream)),
			attribute.String("messaging.destination.partition.id", strconv.Itoa(p.Partition)))
		o.ObserveInt64(pi.lag, p.Lag, attrs)
		o.ObserveInt64(pi.pending, p.Pending, attrs)
		o.ObserveInt64(pi.retries, p.Retries, attrs)
		if !p.Watermark.IsZero() {
			o.ObserveFloat64(pi.watermarkLag, now.Sub(p.Watermark).Seconds(), attrs)
		}
	}
}

// processInstruments are observed per process: whether Redis fails, the dead letters of each
// node's own stream, the leases held, the upstream lag of the sources it runs.
type processInstruments struct {
	dead, leases, redisDown, upstreamLag metric.Int64ObservableGauge
}

func newProcessInstruments(m metric.Meter) (*processInstruments, error) {
	pi := &processInstruments{}
	var err error
	if pi.dead, err = m.Int64ObservableGauge("flowrun.dead_letters", metric.WithUnit("{message}"),
		metric.WithDescription("Entries in a node's own dead-letter stream.")); err != nil {
		return nil, err
	}
	if pi.leases, err = m.Int64ObservableGauge("flowrun.leases.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Partition leases this process holds.")); err != nil {
		return nil, err
	}
	if pi.redisDown, err = m.Int64ObservableGauge("flowrun.redis.failing",
		metric.WithDescription("1 while this process's calls to Redis fail (it waits and retries), else 0.")); err != nil {
		return nil, err
	}
	if pi.upstreamLag, err = m.Int64ObservableGauge("flowrun.source.upstream_lag", metric.WithUnit("{message}"),
		metric.WithDescription("Messages a source's upstream system still holds for it, as the source last learned (a Kafka group's lag, a JetStream consumer's pending count, an AMQP queue's depth); reported by the process that runs the source.")); err != nil {
		return nil, err
	}
	return pi, nil
}

func (pi *processInstruments) observables() []metric.Observable {
	return []metric.Observable{pi.dead, pi.leases, pi.redisDown, pi.upstreamLag}
}

// observe records them.
func (pi *processInstruments) observe(o metric.Observer, c collected, nodeAttrs map[string]metric.MeasurementOption) {
	o.ObserveInt64(pi.redisDown, boolGauge(c.failing))
	for name, length := range c.deadLetters {
		o.ObserveInt64(pi.dead, length, nodeAttrs[name])
	}
	if c.leases >= 0 {
		o.ObserveInt64(pi.leases, int64(c.leases))
	}
	for _, s := range c.upstreamLags {
		o.ObserveInt64(pi.upstreamLag, s.lag, nodeAttrs[s.source])
	}
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
