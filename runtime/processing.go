package runtime

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// processing is what the per-message path needs of the run (lanes.go, layers.go, layer_*.go,
// handlers.go, deadletter.go, fused.go): the clock and logger, the count of work in flight, the
// context that ends it, the jitter of retry delays, tracing and metrics, the keys and streams that
// outputs go to, and the dead letters' log. The runner embeds it; handlers hold it.
type processing struct {
	log      *slog.Logger // the runner's
	clock    stages.Clock // Options.Clock
	activity *Activity    // the run's count, which Options.Activity (if set) follows
	// hard is canceled when shutdown has waited DrainTimeout: work in flight is abandoned then.
	hard    context.Context
	jitter  // draws from Options.Rand
	tracing tracing
	metrics metrics
	keys    redis.Keys
	streams map[string][]string // the stream keys of every topic's partitions, made once
	// deadLetters logs the dead letters as they are made (the runner's obs.deadLetters).
	deadLetters      *deadLetterLog
	redact           func(string) string // flow.Plan.Redact
	retryInPlaceUpTo time.Duration       // Options.RetryInPlaceUpTo
	pipelinePath     string              // Options.PipelinePath
	// dropped is Options.Dropped.
	dropped func(stage, key string, payload []byte, why string)
	// stage is the stage of that name that this process runs, or nil (runner.stageNode).
	stage func(name string) *node
}

// metrics holds the instruments recorded per message: the SDK's, or the process's own Histograms
// (Options.Histograms), which a reader takes as a Producer.
type metrics struct {
	duration metric.Float64Histogram // time to process a message, all attempts
	age      metric.Float64Histogram // time from the entry's write to its input until processing starts
	local    *Histograms             // instead of duration and age
}

// on reports whether messages are measured.
func (ms *metrics) on() bool { return ms.duration != nil || ms.local != nil }

// latencyBuckets suit both sub-millisecond processing and slow retries, in seconds.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// perMessageInstrument names a histogram recorded per message.
type perMessageInstrument struct{ name, unit, description string }

var (
	durationInstrument = perMessageInstrument{"flowrun.message.duration", "s",
		"Time a source, stage or sink took to process a message, all attempts included."}
	ageInstrument = perMessageInstrument{"flowrun.message.age", "s",
		"Time from a message's entry being written to a node's input until the node processes it (at a sink: the latency of the last hop)."}
)

// newMetrics creates the instruments recorded per message, unless local keeps them.
func newMetrics(m metric.Meter, local *Histograms) (metrics, error) {
	if local != nil {
		return metrics{local: local}, nil
	}
	var ms metrics
	var err error
	if ms.duration, err = m.Float64Histogram(durationInstrument.name, metric.WithUnit(durationInstrument.unit),
		metric.WithDescription(durationInstrument.description), metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return metrics{}, err
	}
	if ms.age, err = m.Float64Histogram(ageInstrument.name, metric.WithUnit(ageInstrument.unit),
		metric.WithDescription(ageInstrument.description), metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return metrics{}, err
	}
	return ms, nil
}
