package cmd

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/runtime"
)

// ExitDeadLettered ends a job that finished with messages in dead-letter streams.
const ExitDeadLettered = 3

func newRunCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var conn redisFlags
	var opts runtime.Options
	var logLevel string
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
			"Exit status: 0 done, 1 runtime error, 2 invalid pipeline or options, 3 done but some messages were " +
			"dead-lettered (job mode).",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			level, err := parseLogLevel(logLevel)
			if err != nil {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			plan, cfg, diags := flags.build(args[0])
			printDiagnostics(stdio.Err, diags, cfg.Files())
			if diags.HasErrors() {
				return exitError{code: ExitInvalid}
			}
			client, closeClient, err := conn.connect(c.Context(), stdio.Err, true)
			if err != nil {
				return err
			}
			defer closeClient()

			opts.Redis = client
			opts.Stdin, opts.Stdout = stdio.In, stdio.Out
			opts.Logger = slog.New(slog.NewTextHandler(stdio.Err, &slog.HandlerOptions{Level: level}))
			summary, err := runtime.Run(c.Context(), plan, opts)
			if summary != nil {
				_ = summary.Write(stdio.Err)
			}
			var configErr *runtime.ConfigError
			switch {
			case errors.As(err, &configErr):
				return exitError{code: ExitInvalid, message: err.Error()}
			case err != nil:
				return exitError{code: ExitError, message: plan.Redact(err.Error())}
			case opts.UntilDrained && summary.DeadLettered() > 0:
				return exitError{code: ExitDeadLettered, message: fmt.Sprintf("%d message%s dead-lettered; see flowrun inspect",
					summary.DeadLettered(), plural(int(summary.DeadLettered())))}
			}
			return nil
		},
	}
	flags.register(c)
	conn.register(c)
	c.Flags().StringSliceVar(&opts.Nodes, "stages", nil, "run only these sources, stages and sinks (comma-separated); the default runs all")
	c.Flags().BoolVar(&opts.UntilDrained, "until-drained", false, "run as a job: exit when every source is exhausted and all work is done")
	c.Flags().DurationVar(&opts.LeaseTTL, "lease-ttl", 10*time.Second, "how long a partition lease lasts without renewal (a dead process's partitions move after it)")
	c.Flags().DurationVar(&opts.DrainTimeout, "drain-timeout", 10*time.Second, "how long a stop may take to finish the work in flight")
	c.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return c
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("invalid --log-level %q: use debug, info, warn or error", s)
	}
	return l, nil
}
