package runtime_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/flowtest"
	redis "github.com/flowrun/flowrun/transport/redis"
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

// TestMetricsRecordEveryMessage: the two histograms hold a measurement per message and node, each
// with its own value, however the messages were batched. On a clock that never moves every
// processing time is 0, and every age is the clock less the time of the message's entry, which
// the test reads from the IDs of the entries the node read: a histogram recorded per batch, or
// one that lost or repeated a message's measurement, has another count or another sum. Both ways
// of keeping them: recorded through the MeterProvider, and kept by Options.Histograms for a reader
// that takes them as a Producer (flowrun run's /metrics).
func TestMetricsRecordEveryMessage(t *testing.T) {
	t.Run("MeterProvider", func(t *testing.T) { testMetricsRecordEveryMessage(t, nil) })
	t.Run("Histograms", func(t *testing.T) { testMetricsRecordEveryMessage(t, runtime.NewHistograms()) })
}

func testMetricsRecordEveryMessage(t *testing.T, local *runtime.Histograms) {
	const n = 700 // more than a batch of one unit of a 2-partition topic needs, fewer than 2 reads' worth
	reader := sdkmetric.NewManualReader()
	if local != nil {
		reader = sdkmetric.NewManualReader(sdkmetric.WithProducer(local))
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	c := server.open(t)
	out := fmt.Sprintf("metrics-every-%d:out", prefixes.Add(1))
	plan := buildSource(t, drainPipeline(out, n, false, "", `kind = "filter"
  where  = msg.i >= 0`))
	j := startDrainingJob(t, plan, runtime.Options{Clock: flowtest.NewClock(flowtest.Epoch), MeterProvider: mp, Histograms: local})
	j.wait(t)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	points := map[string]map[string]metricdata.HistogramDataPoint[float64]{} // instrument -> node -> point
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if data, ok := m.Data.(metricdata.Histogram[float64]); ok {
				points[m.Name] = map[string]metricdata.HistogramDataPoint[float64]{}
				for _, dp := range data.DataPoints {
					points[m.Name][node(dp.Attributes)] = dp
				}
			}
		}
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	for name, input := range map[string]string{"work": "in", "out": "done"} {
		// The ages the node must have measured: the clock less each entry's time, in seconds.
		var ages float64
		for p := range 2 {
			entries, err := c.Universal().XRange(context.Background(), keys.Stream(input, p), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				ms, err := redis.IDMillis(e.ID)
				if err != nil {
					t.Fatal(err)
				}
				ages += flowtest.Epoch.Sub(time.UnixMilli(ms)).Seconds()
			}
		}
		took, aged := points["flowrun.message.duration"][name], points["flowrun.message.age"][name]
		if took.Count != n || aged.Count != n {
			t.Errorf("%s: %d processing times and %d ages, want %d of each", name, took.Count, aged.Count, n)
		}
		if took.Sum != 0 || took.BucketCounts[0] != n {
			t.Errorf("%s: processing times sum to %v in buckets %v, want %d times 0", name, took.Sum, took.BucketCounts, n)
		}
		if math.Abs(aged.Sum-ages) > 1e-9*math.Abs(ages) {
			t.Errorf("%s: ages sum to %v, want %v (the clock less each entry's time)", name, aged.Sum, ages)
		}
	}
}

func node(attrs attribute.Set) string {
	v, _ := attrs.Value("flowrun.node")
	return v.AsString()
}
