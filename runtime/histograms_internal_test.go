package runtime

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestHistogramsAsTheSDKWould: the same measurements recorded through sdk/metric, a Record each,
// and kept by Histograms give the same data points: attributes, bounds, bucket counts, count, sum,
// minimum and maximum. The values include every bound itself (a bound belongs to the bucket it
// ends), zero, negative ages (a clock behind the entry's) and values past the last bound.
func TestHistogramsAsTheSDKWould(t *testing.T) {
	sdkReader := sdkmetric.NewManualReader()
	sdkProvider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkReader))
	local := NewHistograms()
	localReader := sdkmetric.NewManualReader(sdkmetric.WithProducer(local))
	_ = sdkmetric.NewMeterProvider(sdkmetric.WithReader(localReader)) // a reader collects once registered

	var p processing
	var err error
	if p.metrics, err = newMetrics(sdkProvider.Meter(meterName), nil); err != nil {
		t.Fatal(err)
	}
	nodes := []*node{{name: "a", typ: "stage", kind: "map"}, {name: "out", typ: "sink", kind: "stdout"}}
	for _, n := range nodes {
		setMetricAttrs(n)
	}
	values := append([]float64{0, -2.5, 61, 1e9}, latencyBuckets...)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		values = append(values, rng.ExpFloat64()/1000, rng.ExpFloat64()*3)
	}
	var list []measurement
	for i, v := range values {
		list = append(list, measurement{node: nodes[i%2], took: v, age: values[(i*7)%len(values)] - 0.001, aged: i%3 != 0})
	}
	p.recordEach(list)
	local.add(list)

	want, got := collectHistograms(t, sdkReader), collectHistograms(t, localReader)
	if len(want) != 4 || len(got) != len(want) {
		t.Fatalf("series: the SDK's %d, Histograms' %d; want 4 each (2 instruments, 2 nodes)", len(want), len(got))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%v: no series", k)
			continue
		}
		if !g.Attributes.Equals(&w.Attributes) || g.Count != w.Count || g.Sum != w.Sum ||
			!slices.Equal(g.Bounds, w.Bounds) || !slices.Equal(g.BucketCounts, w.BucketCounts) || g.Min != w.Min || g.Max != w.Max {
			t.Errorf("%v:\n got %+v\nwant %+v", k, g, w)
		}
	}
}

// collectHistograms collects a reader's float histograms by instrument and node.
func collectHistograms(t *testing.T, r *sdkmetric.ManualReader) map[[2]string]metricdata.HistogramDataPoint[float64] {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[[2]string]metricdata.HistogramDataPoint[float64]{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if data, ok := m.Data.(metricdata.Histogram[float64]); ok {
				for _, dp := range data.DataPoints {
					v, _ := dp.Attributes.Value("flowrun.node")
					out[[2]string{m.Name, v.AsString()}] = dp
				}
			}
		}
	}
	return out
}
