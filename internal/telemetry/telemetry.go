// Package telemetry sets up the OpenTelemetry exporters of a flowrun process: traces to OTLP (gRPC or
// HTTP), to the console or to a file, from flags and the standard OTEL_* environment variables, and
// metrics for a Prometheus scrape endpoint.
//
// It is wiring for the command line, not a general OpenTelemetry distribution: it does not set the
// global providers, and offers only the exporters flowrun documents.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config says which telemetry to export.
type Config struct {
	// Trace is the trace exporter: "none", "stdout" (printed on Console), "otlp", or "" to follow
	// OTEL_TRACES_EXPORTER (otlp, console, none), which in turn defaults to none unless an OTLP
	// endpoint is set in OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
	Trace string
	// TraceFile, when set, writes spans as JSON to this file (and overrides Trace).
	TraceFile string
	// Console receives the spans of the "stdout" exporter; flowrun passes standard error so that the
	// messages of stdout sinks stay alone on standard output.
	Console io.Writer
	// Metrics enables the meter provider and the Prometheus handler.
	Metrics bool
	// Producer, with Metrics, adds the metrics it produces to those of the meter provider: the
	// runtime's per-message histograms (runtime.Histograms).
	Producer sdkmetric.Producer
	// Pipeline names the pipeline in the resource of every span and metric.
	Pipeline string
	// Version is flowrun's version, for the resource.
	Version string
}

// Telemetry is what Setup made. Fields are nil for what is off.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// MetricsHandler serves the metrics in the Prometheus text format.
	MetricsHandler http.Handler
	// SampleRoot decides about new traces for the runtime (runtime.Options.SampleRoot) when the
	// sampler is a ratio of new traces: the runtime then asks before it builds a span, and the
	// TracerProvider samples every root it starts. nil when the TracerProvider decides.
	SampleRoot func() bool

	shutdown []func(context.Context) error
}

// Setup builds the exporters and providers. The sampler follows OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG (default: sample every trace whose parent is sampled, and every new one).
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", serviceName()),
			attribute.String("service.version", cfg.Version),
			attribute.String("flowrun.pipeline", cfg.Pipeline),
		))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	t := &Telemetry{}
	exporter, err := traceExporter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if exporter != nil {
		opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exporter), sdktrace.WithResource(res)}
		if ratio, ok := rootRatio(os.Getenv); ok {
			t.SampleRoot = func() bool { return rand.Float64() < ratio }
			opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
		}
		tp := sdktrace.NewTracerProvider(opts...)
		t.TracerProvider = tp
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}
	if cfg.Metrics {
		reg := prometheus.NewRegistry()
		opts := []otelprom.Option{otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo()}
		if cfg.Producer != nil {
			opts = append(opts, otelprom.WithProducer(cfg.Producer))
		}
		exp, err := otelprom.New(opts...)
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
		t.MeterProvider = mp
		t.MetricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
		t.shutdown = append(t.shutdown, mp.Shutdown)
	}
	return t, nil
}

// Shutdown flushes and stops the exporters.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// rootRatio returns the ratio of new traces to sample when OTEL_TRACES_SAMPLER is
// parentbased_traceidratio with a valid OTEL_TRACES_SAMPLER_ARG (a number in [0, 1]): with it a
// trace is sampled where it starts and followed wherever its parent is. Other samplers, and an
// argument the SDK would not take, stay with the SDK.
func rootRatio(getenv func(string) string) (float64, bool) {
	if strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")) != "parentbased_traceidratio" {
		return 0, false
	}
	ratio, err := strconv.ParseFloat(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG")), 64)
	if err != nil || ratio < 0 || ratio > 1 {
		return 0, false
	}
	return ratio, true
}

func serviceName() string {
	if s := os.Getenv("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return "flowrun"
}

// traceExporter picks the span exporter; nil means tracing is off.
func traceExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	if cfg.TraceFile != "" {
		f, err := os.OpenFile(cfg.TraceFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("--trace-file: %w", err)
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
		if err != nil {
			_ = f.Close() // nothing was written to it: the exporter's error is the one to report
			return nil, err
		}
		return closingExporter{exp, f}, nil
	}
	kind := strings.ToLower(strings.TrimSpace(cfg.Trace))
	if kind == "" {
		kind = strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
		if kind == "" && (os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "") {
			kind = "otlp"
		}
	}
	switch kind {
	case "", "none":
		return nil, nil
	case "stdout", "console":
		console := cfg.Console
		if console == nil {
			console = os.Stderr
		}
		return stdouttrace.New(stdouttrace.WithWriter(console), stdouttrace.WithPrettyPrint())
	case "otlp":
		protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if protocol == "" {
			protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch protocol {
		case "", "grpc":
			return otlptracegrpc.New(ctx)
		case "http/protobuf":
			return otlptracehttp.New(ctx)
		}
		return nil, fmt.Errorf("OTLP protocol %q is not supported: use grpc or http/protobuf", protocol)
	}
	return nil, fmt.Errorf("trace exporter %q is not supported: use none, stdout or otlp (or OTEL_TRACES_EXPORTER)", kind)
}

// closingExporter closes the trace file when the exporter shuts down.
type closingExporter struct {
	sdktrace.SpanExporter
	f *os.File
}

func (e closingExporter) Shutdown(ctx context.Context) error {
	return errors.Join(e.SpanExporter.Shutdown(ctx), e.f.Close())
}
