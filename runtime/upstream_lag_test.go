package runtime_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
)

// test_upstream (a source kind of the tests) reports an upstream lag of its lag attribute, then
// waits for the run to end: a source reading another system, with that many messages there.
func init() {
	stages.RegisterSource(stages.SourceKind{
		Spec: &flow.Kind{Name: "test_upstream", Doc: "Reports an upstream lag, then waits (a source of the tests).",
			Attributes: []flow.Attribute{{Name: "lag", Type: flow.TypeInteger, Required: true, Doc: "The lag to report."}},
			Example:    "source \"s\" {\n  kind   = \"test_upstream\"\n  lag    = 42\n  output = topic.in\n}"},
		Traits: stages.SourceTraits{Finite: func(flow.Attrs) (bool, int64) { return false, 0 }},
		New: func(s *flow.Source, _ stages.Env) (stages.Source, error) {
			return upstreamSource{lag: s.Config.Int("lag")}, nil
		},
	})
}

type upstreamSource struct{ lag int64 }

func (s upstreamSource) Produce(ctx context.Context, out stages.Emitter) error {
	out.ReportLag(s.lag)
	<-ctx.Done()
	return nil
}

// TestASourcesUpstreamLagIsShown: what a source reports with ReportLag is in the process's
// snapshot (the page), in its metrics, and, published to Redis, in flowrun inspect of another
// process; once the run ends it is gone from the snapshot.
func TestASourcesUpstreamLagIsShown(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	c := server.open(t)
	plan := buildSource(t, fmt.Sprintf(`
pipeline "upstream-%d" {}
topic "in" {}
source "broker" {
  kind   = "test_upstream"
  lag    = 4242
  output = topic.in
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`, prefixes.Add(1)))
	s := startService(t, c, plan, runtime.Options{MeterProvider: mp, ProcessID: "upstream-test#1"})
	lagOf := func() int64 {
		for _, p := range s.rt.Snapshot().Sources {
			if p.Name == "broker" {
				return p.UpstreamLag
			}
		}
		return -2
	}
	waitFor(t, "the snapshot to show the reported lag", func() bool { return lagOf() == 4242 })

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var gauge []int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "flowrun.source.upstream_lag" {
				for _, dp := range g.DataPoints {
					if node(dp.Attributes) == "broker" {
						gauge = append(gauge, dp.Value)
					}
				}
			}
		}
	}
	if len(gauge) != 1 || gauge[0] != 4242 {
		t.Errorf("flowrun.source.upstream_lag{node=broker}: %v, want [4242]", gauge)
	}

	var report *admin.Report
	waitFor(t, "inspect to show the published lag", func() bool {
		var err error
		report, err = admin.Inspect(context.Background(), c, plan, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return len(report.Sources) == 1 && report.Sources[0].Upstream != nil
	})
	if up := report.Sources[0].Upstream; up.Lag != 4242 || up.Process != "upstream-test#1" {
		t.Errorf("inspect's upstream lag: %+v, want 4242 published by upstream-test#1", *up)
	}

	s.stop()
	if got := lagOf(); got != -1 {
		t.Errorf("after the run the snapshot's upstream lag is %d, want -1 (none)", got)
	}
}
