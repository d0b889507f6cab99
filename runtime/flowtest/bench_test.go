package flowtest

import (
	"context"
	"testing"
	"time"
)

// BenchmarkFiveAttemptsOfExponentialBackoff runs a message through a sink that fails four times
// under a policy of five attempts with exponential backoff up to 30s: about a minute of virtual
// time per run. It reports the virtual seconds that pass per run; ns/op is the wall time.
//
//	go test ./runtime/flowtest -run '^$' -bench FiveAttempts
func BenchmarkFiveAttemptsOfExponentialBackoff(b *testing.B) {
	plan := compile(b, retryPipeline)
	var virtual time.Duration
	for b.Loop() {
		results := RunFile(context.Background(), retryFile(), plan, Options{})
		if len(results) != 1 || !results[0].Passed() {
			b.Fatalf("the run failed: %+v", results)
		}
		virtual += results[0].Virtual
	}
	b.ReportMetric(virtual.Seconds()/float64(b.N), "virtual-s/op")
}
