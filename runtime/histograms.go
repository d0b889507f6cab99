package runtime

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Histograms keeps the two per-message histograms (flowrun.message.duration and
// flowrun.message.age) in the process, bucket by bucket, and hands them to a metrics reader as an
// OpenTelemetry Producer (the Prometheus exporter's WithProducer, sdk/metric's WithProducer).
//
// Why: the SDK's Record costs about 250 ns a call, half of it normalising the attribute set
// (attrnorm.Set), and OpenTelemetry has no record-with-count, so recording through a MeterProvider
// costs two calls per message and node: 12-19 % of FW-1's CPU. Here a lane's measurements are
// added under one lock per batch, a bucket search and a few additions each. The data points are
// the ones the SDK would make of the same measurements (the same bounds, bucket rule, count, sum,
// minimum and maximum, cumulative), so /metrics shows the same histograms; there are no exemplars
// (the SDK's would need a sampled span in the record's context, which the runtime never gave it).
//
// Give it to the reader and to Options.Histograms; the runtime then records these two histograms
// here only, and everything else through Options.MeterProvider.
type Histograms struct {
	mu     sync.Mutex
	start  time.Time
	series map[histogramKey]*histogram
	order  []histogramKey // the series in the order they appeared, so that the output is stable
}

// histogramKey names a series: an instrument's name and a node's.
type histogramKey struct {
	instrument string
	node       string
}

// histogram is a series' cumulative state: what sdk/metric's explicit-bucket histogram keeps.
type histogram struct {
	attrs    attribute.Set
	counts   []uint64 // len(latencyBuckets)+1: (-inf, b0], (b0, b1], ..., (bn, +inf)
	count    uint64
	min, max float64
	// The sum in two parts, as sdk/metric keeps it: whole values added as integers, the others as
	// floats; its value is their sum.
	sumInt   int64
	sumFloat float64
}

// NewHistograms returns empty histograms, their start time now.
func NewHistograms() *Histograms {
	return &Histograms{start: time.Now(), series: map[histogramKey]*histogram{}}
}

// add adds a lane's measurements.
func (h *Histograms) add(ms []measurement) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range ms {
		m := &ms[i]
		h.seriesOf(durationInstrument.name, m.node).observe(m.took)
		if m.aged {
			h.seriesOf(ageInstrument.name, m.node).observe(m.age)
		}
	}
}

// seriesOf returns a node's series of an instrument, made on its first measurement.
func (h *Histograms) seriesOf(instrument string, n *node) *histogram {
	k := histogramKey{instrument, n.name}
	s := h.series[k]
	if s == nil {
		s = &histogram{attrs: nodeAttrSet(n), counts: make([]uint64, len(latencyBuckets)+1)}
		h.series[k] = s
		h.order = append(h.order, k)
	}
	return s
}

// observe adds a value as sdk/metric does: the bucket of the first bound at or above it.
func (s *histogram) observe(v float64) {
	s.counts[sort.SearchFloat64s(latencyBuckets, v)]++
	if s.count == 0 || v < s.min {
		s.min = v
	}
	if s.count == 0 || v > s.max {
		s.max = v
	}
	s.count++
	if whole := int64(v); float64(whole) == v {
		s.sumInt += whole
	} else {
		s.sumFloat += v
	}
}

// Produce returns the histograms as of now (sdk/metric.Producer).
func (h *Histograms) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	var metrics []metricdata.Metrics
	for _, inst := range []perMessageInstrument{durationInstrument, ageInstrument} {
		data := metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality}
		for _, k := range h.order {
			if k.instrument != inst.name {
				continue
			}
			s := h.series[k]
			data.DataPoints = append(data.DataPoints, metricdata.HistogramDataPoint[float64]{
				Attributes: s.attrs, StartTime: h.start, Time: now,
				Count: s.count, Bounds: slices.Clone(latencyBuckets), BucketCounts: slices.Clone(s.counts),
				Min: metricdata.NewExtrema(s.min), Max: metricdata.NewExtrema(s.max), Sum: s.sumFloat + float64(s.sumInt),
			})
		}
		if len(data.DataPoints) > 0 {
			metrics = append(metrics, metricdata.Metrics{Name: inst.name, Description: inst.description, Unit: inst.unit, Data: data})
		}
	}
	if len(metrics) == 0 {
		return nil, nil
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: meterName}, Metrics: metrics}}, nil
}
