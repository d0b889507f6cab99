package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/telemetry"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/runtime/web"
)

// ExitDeadLettered ends a job that finished with messages in dead-letter streams.
const ExitDeadLettered = 3

// embeddedBlock is how long a read on the embedded Redis waits for new entries.
const embeddedBlock = 20 * time.Millisecond

func newRunCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var conn redisFlags
	var opts runtime.Options
	var httpAddr string
	var logLevel, logFormat, traceExporter, traceFile string
	var watch bool
	var watchInterval time.Duration
	c := &cobra.Command{
		Use:   "run PATH",
		Short: "Run a pipeline, as a service or as a job",
		Long: "Run compiles a pipeline and runs it on Redis until it is interrupted (SIGINT or SIGTERM), then " +
			"finishes the batches in flight, acknowledges them and releases its partitions. Several processes " +
			"running the same pipeline share its partitions.\n\n" +
			"With --until-drained it runs as a job: it exits once every source is exhausted and every stage and " +
			"sink is drained, and prints a summary.\n\n" +
			"Without --redis or " + EnvRedisURL + " it runs on an embedded in-memory Redis, whose data is lost " +
			"when it exits.\n\n" +
			"A service reloads its pipeline on SIGHUP, and with --watch whenever its files change: a change with " +
			"errors is refused with its diagnostics and the run goes on as it was; unchanged nodes go on untouched; " +
			"changed stages and sinks finish their batch in flight and start again with the new definition; new ones " +
			"start; removed ones stop (their consumer groups stay until flowrun reset). A stateful stage whose state " +
			"would mean something else under the change (its kind, key, group_by, window or aggregate set) is " +
			"refused, at a reload as at a start, unless --reset-state names it: its state is then deleted. " +
			"Changes of sources, topics, tables or the pipeline block need a restart. See docs/running.md, Reloading.\n\n" +
			"Exit status: 0 done, 1 runtime error, 2 invalid pipeline or options, 3 done but some messages were " +
			"dead-lettered (job mode).",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) (err error) {
			jsonLog := logFormat == "json"
			if jsonLog {
				defer func() { err = jsonLogged(err) }()
			}
			// On a terminal, a job's progress is a line redrawn in place: everything else that shows
			// on the terminal writes through it, so that its lines go above the progress line.
			stderr := stdio.Err
			terminal := opts.UntilDrained && !jsonLog && isTerminal(stdio.Err)
			opts.Stdin, opts.Stdout = stdio.In, stdio.Out
			if terminal {
				status := newStatusLine(stdio.Err)
				stderr = status
				if isTerminal(stdio.Out) {
					opts.Stdout = status.Output(stdio.Out)
				}
			}
			logger, err := newLogger(stderr, logLevel, logFormat)
			if err != nil {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			if opts.BatchSize < 1 || opts.BatchSize > runtime.MaxBatchSize {
				return exitError{code: ExitInvalid, message: fmt.Sprintf("--batch-size %d: give 1 to %d", opts.BatchSize, runtime.MaxBatchSize)}
			}
			if watch && opts.UntilDrained {
				return exitError{code: ExitInvalid, message: "--watch reloads a service; a job (--until-drained) runs the pipeline it started with"}
			}
			showDiagnostics := func(cfg *flow.Config, diags hcl.Diagnostics) bool {
				if jsonLog {
					logDiagnostics(stdio.Err, diags, cfg.Files())
				} else {
					printDiagnostics(stdio.Err, diags, cfg.Files())
				}
				return diags.HasErrors()
			}
			plan, cfg, diags := flags.build(args[0])
			if showDiagnostics(cfg, diags) {
				return exitError{code: ExitInvalid}
			}
			if err := checkResetState(plan, opts.ResetState); err != nil {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			if opts.NoFusion {
				plan.Unfuse() // so that the live page draws the hops as they run
			}
			// connect starts the embedded Redis when none is configured; its dead letters are gone
			// when the process exits.
			urls, _ := conn.configured()
			embedded := len(urls) == 0
			banner := stderr
			if jsonLog {
				banner = jsonLines{w: stdio.Err, level: slog.LevelWarn}
			}
			client, closeClient, err := conn.connect(c.Context(), banner, true)
			if err != nil {
				return err
			}
			defer closeClient()

			telConfig := telemetry.Config{
				Trace: traceExporter, TraceFile: traceFile, Console: stdio.Err, Metrics: httpAddr != "",
				Pipeline: plan.Name, Version: currentVersion().Version,
			}
			if telConfig.Metrics {
				// The per-message histograms are kept in the process and read by the exporter
				// (runtime.Histograms): recording them through the SDK cost a fifth of a hop's CPU.
				opts.Histograms = runtime.NewHistograms()
				telConfig.Producer = opts.Histograms
			}
			tel, err := telemetry.Setup(c.Context(), telConfig)
			if err != nil {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context()), 5*time.Second)
				defer cancel()
				if err := tel.Shutdown(ctx); err != nil {
					logger.Warn("flushing telemetry failed", "err", err)
				}
			}()

			opts.Redis = client.Client()
			if embedded {
				// miniredis has no CLIENT UNBLOCK: an idle read waits out its Block before it sees a
				// stop, so the reads of the in-process server wait briefly.
				opts.Block = embeddedBlock
			}
			opts.Logger = logger
			opts.PipelinePath = args[0]
			opts.TracerProvider, opts.SampleRoot, opts.MeterProvider = tel.TracerProvider, tel.SampleRoot, tel.MeterProvider
			rt, err := runtime.New(plan, opts)
			var configErr *runtime.ConfigError
			if errors.As(err, &configErr) {
				return exitError{code: ExitInvalid, message: err.Error()}
			} else if err != nil {
				return exitError{code: ExitError, message: plan.Redact(err.Error())}
			}
			if httpAddr != "" {
				stop, err := serveHTTP(c.Context(), rt, httpAddr, tel.MetricsHandler, logger)
				if err != nil {
					return exitError{code: ExitError, message: err.Error()}
				}
				defer stop()
			}
			stopProgress := func() {}
			if opts.UntilDrained {
				stopProgress = reportProgress(c.Context(), rt, stderr, terminal, logger)
				defer stopProgress()
			}
			if !opts.UntilDrained {
				rl := &reloader{rt: rt, flags: &flags, path: args[0], noFusion: opts.NoFusion, log: logger, diagnostics: showDiagnostics}
				stopReloads := rl.start(c.Context(), watch, watchInterval)
				defer stopReloads()
			}
			summary, err := rt.Run(c.Context())
			stopProgress() // the summary follows the last progress report, not the other way round
			if summary != nil {
				if embedded && summary.DeadLettered() > 0 {
					// Listed now, while the embedded Redis still holds them.
					ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context()), 10*time.Second)
					list, listErr := admin.ListDeadLetters(ctx, client.Client(), plan, summary.Nodes)
					cancel()
					if listErr != nil {
						logger.Warn("listing the dead letters failed", "err", listErr)
					}
					summary.Ephemeral, summary.DeadLetters = true, list
				}
				if jsonLog {
					_ = writeSummaryJSON(stdio.Err, summary)
				} else {
					_ = writeSummary(stderr, summary)
				}
			}
			switch {
			case errors.As(err, &configErr):
				return exitError{code: ExitInvalid, message: err.Error()}
			case err != nil:
				return exitError{code: ExitError, message: plan.Redact(err.Error())}
			case opts.UntilDrained && summary.DeadLettered() > 0:
				return exitError{code: ExitDeadLettered, message: deadLetterNote(summary)}
			}
			return nil
		},
	}
	flags.register(c)
	conn.register(c)
	c.Flags().StringSliceVar(&opts.Nodes, "stages", nil, "run only these sources, stages and sinks (comma-separated); the default runs all")
	c.Flags().BoolVar(&opts.UntilDrained, "until-drained", false, "run as a job: exit when every source is exhausted and all work is done")
	c.Flags().BoolVar(&opts.NoFusion, "no-fusion", false, "run every stage in a hop of its own, as if each set fuse = false (to compare, or to split a chain over processes)")
	c.Flags().IntVar(&opts.BatchSize, "batch-size", 1000, "the most entries one read of a partition takes, and a source writes at once, 1 to 1000: smaller batches commit more often, larger ones are faster")
	c.Flags().DurationVar(&opts.LeaseTTL, "lease-ttl", 10*time.Second, "how long a partition lease lasts without renewal (a dead process's partitions move after it)")
	c.Flags().StringVar(&httpAddr, "http", "", "serve /healthz, /readyz, /metrics and a live page of the graph on this address "+
		"(a port alone, such as :9464, listens on 127.0.0.1 only)")
	c.Flags().BoolVar(&watch, "watch", false, "reload the pipeline whenever its files (or --var-file files) change; a service reloads on SIGHUP too")
	c.Flags().DurationVar(&watchInterval, "watch-interval", time.Second, "how often --watch looks at the files; a change is reloaded once they stayed the same for this long")
	c.Flags().StringSliceVar(&opts.ResetState, "reset-state", nil, "stateful stages (comma-separated) whose state is deleted, at start or on a reload, "+
		"if their definition changed so that their state means something else; without it such a change is refused")
	c.Flags().DurationVar(&opts.DrainTimeout, "drain-timeout", 10*time.Second, "how long a stop may take to finish the work in flight")
	c.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	c.Flags().StringVar(&logFormat, "log-format", "text", "log format: text or json")
	c.Flags().StringVar(&traceExporter, "trace", "", "trace exporter: none, stdout (printed on standard error) or otlp (default: OTEL_TRACES_EXPORTER, or none)")
	c.Flags().StringVar(&traceFile, "trace-file", "", "write spans as JSON lines to this file")
	return c
}

// newLogger builds the log of a run on w.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("invalid --log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("invalid --log-format %q: use text or json", format)
}

// serveHTTP serves web.NewHandler on addr until stop is called.
func serveHTTP(ctx context.Context, rt *runtime.Runtime, addr string, metrics http.Handler, log *slog.Logger) (stop func(), err error) {
	addr = httpListenAddr(addr)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", addr, err)
	}
	srv := &http.Server{Handler: web.NewHandler(rt, metrics), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("the HTTP server stopped", "err", err)
		}
	}()
	log.Info("serving HTTP", "url", "http://"+ln.Addr().String()+"/")
	return func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(stopCtx); err != nil {
			_ = srv.Close() // requests still running after the timeout are cut off
		}
		<-served
	}, nil
}

// reportProgress reports a job's progress on w (a line redrawn in place on a terminal, log lines
// otherwise) until stop is called; stop may be called more than once.
func reportProgress(ctx context.Context, rt *runtime.Runtime, w io.Writer, terminal bool, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		showProgress(ctx, rt, progressOptions{Terminal: terminal, Out: w, Logger: log})
	}()
	return func() { cancel(); <-done }
}

// jsonLines writes each line written to it as a JSON log record: for messages that are printed as
// text elsewhere (the embedded Redis's warning), when the log is JSON.
type jsonLines struct {
	w     io.Writer
	level slog.Level
}

func (j jsonLines) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line = strings.TrimSpace(strings.TrimPrefix(line, "flowrun: ")); line != "" {
			writeJSONRecord(j.w, j.level, line)
		}
	}
	return len(p), nil
}

// logDiagnostics writes diagnostics as JSON log records, one each, in the form of validate --json.
func logDiagnostics(w io.Writer, diags hcl.Diagnostics, files map[string]*hcl.File) {
	for _, d := range flow.DiagnosticsJSON(diags, files) {
		level := slog.LevelError
		if d.Severity == "warning" {
			level = slog.LevelWarn
		}
		writeJSONRecord(w, level, d.Summary, slog.Any("diagnostic", d))
	}
}

// httpListenAddr completes --http: an address without a host ("9464" or ":9464") listens on the
// loopback interface only; an explicit host ("0.0.0.0:9464") is kept.
func httpListenAddr(addr string) string {
	if !strings.Contains(addr, ":") {
		return net.JoinHostPort("127.0.0.1", addr)
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}
