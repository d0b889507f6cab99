package runtime_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/flowrun/flowrun/runtime"
)

// TestMetrics runs the traced pipeline with a metrics reader and checks the counters, the histograms
// and the polled gauges. It runs as a service until the gauges have been polled with everything
// delivered: a job may end before its first poll is done.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	plan := buildTestdata(t, "traced")
	s := startService(t, server.open(t), plan, runtime.Options{MeterProvider: mp, PollInterval: 10 * time.Millisecond})

	var sums map[string]map[string]int64 // metric -> node -> value
	var histograms map[string]map[string]uint64
	var gauges map[string]int
	collect := func() {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		sums, histograms, gauges = map[string]map[string]int64{}, map[string]map[string]uint64{}, map[string]int{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch data := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, dp := range data.DataPoints {
						if sums[m.Name] == nil {
							sums[m.Name] = map[string]int64{}
						}
						sums[m.Name][node(dp.Attributes)] = dp.Value
					}
				case metricdata.Histogram[float64]:
					for _, dp := range data.DataPoints {
						if histograms[m.Name] == nil {
							histograms[m.Name] = map[string]uint64{}
						}
						histograms[m.Name][node(dp.Attributes)] = dp.Count
					}
				case metricdata.Gauge[int64]:
					gauges[m.Name] += len(data.DataPoints)
				}
			}
		}
	}
	waitFor(t, "the four messages delivered and every dead-letter stream polled", func() bool {
		collect()
		return sums["flowrun.messages.out"]["print"] == 4 && gauges["flowrun.dead_letters"] == 5
	})
	s.stop()
	for name, want := range map[string]map[string]int64{
		"flowrun.messages.in":  {"gen": 4, "a": 4, "b": 4, "c": 4, "print": 4},
		"flowrun.messages.out": {"gen": 4, "a": 4, "b": 4, "c": 4, "print": 4}, // a sink counts what it delivered
	} {
		for n, v := range want {
			if got := sums[name][n]; got != v {
				t.Errorf("%s{node=%s} = %d, want %d", name, n, got, v)
			}
		}
	}
	for _, n := range []string{"a", "b", "c", "print"} {
		if histograms["flowrun.message.duration"][n] != 4 || histograms["flowrun.message.age"][n] != 4 {
			t.Errorf("histograms of %s: duration %d, age %d; want 4 each", n,
				histograms["flowrun.message.duration"][n], histograms["flowrun.message.age"][n])
		}
	}
	// Two partitions for each consumer group: the chain a+b+c's (fused, its group is a's) and sink
	// print's.
	if gauges["flowrun.partition.lag"] != 4 || gauges["flowrun.partition.pending"] != 4 {
		t.Errorf("lag and pending gauges: %v", gauges)
	}
	if gauges["flowrun.dead_letters"] != 5 || gauges["flowrun.leases.held"] != 1 {
		t.Errorf("dead-letter and lease gauges: %v", gauges)
	}
}

func node(attrs attribute.Set) string {
	v, _ := attrs.Value("flowrun.node")
	return v.AsString()
}
