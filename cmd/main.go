// Package cmd is the flowrun command line: flags and wiring, no pipeline logic. It is a library so
// that a custom binary with extra Go stage functions is a blank import plus a call to Main:
//
//	package main
//
//	import (
//		"github.com/flowrun/flowrun/cmd"
//		_ "example.com/acme/flowstages" // calls stages.Register in init
//	)
//
//	func main() { cmd.Main() }
//
// What a run shows on a terminal is drawn here, from the data that package runtime gives (Snapshot,
// Summary): a job's progress line (progress.go), the status line that keeps it below the log
// (statusline.go), and the summary table or JSON record (summary.go). The HTTP endpoints and the
// live page are package runtime/web's; run.go only wires them to --http.
package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes shared by every command.
const (
	ExitOK      = 0
	ExitError   = 1 // a runtime error, or a check that found something (fmt --check)
	ExitInvalid = 2 // the pipeline or the command line is invalid
)

// Main runs the flowrun command line with the process's arguments and exits with its code.
func Main() {
	if os.Getenv("GOGC") == "" {
		// A pipeline allocates per batch and keeps little alive: collecting less often costs tens
		// of megabytes and saves about a third of the CPU (BENCHMARKS.md). GOGC, when set, wins.
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Execute(ctx, os.Args[1:], IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}

// IO is where a command reads and writes.
type IO struct {
	In       io.Reader
	Out, Err io.Writer
}

// Execute runs the command line with args and returns the exit code.
func Execute(ctx context.Context, args []string, stdio IO) int {
	root := newRootCommand(stdio)
	root.SetArgs(goStyleTestFlags(args))
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var exit exitError
	if errors.As(err, &exit) {
		switch {
		case exit.message == "":
		case exit.json:
			writeJSONRecord(stdio.Err, slog.LevelError, exit.message, slog.Int("exit_code", exit.code))
		default:
			note(stdio.Err, "Error: %s\n", exit.message)
		}
		return exit.code
	}
	// Cobra's own errors: unknown command or flag, wrong number of arguments.
	if jsonLogRequested(args) {
		writeJSONRecord(stdio.Err, slog.LevelError, err.Error(), slog.Int("exit_code", ExitInvalid),
			slog.String("usage", root.Name()+" --help"))
		return ExitInvalid
	}
	note(stdio.Err, "Error: %v\nRun '%s --help' for usage.\n", err, root.Name())
	return ExitInvalid
}

// exitError ends a command with a specific exit code; an empty message means the command has
// already said what went wrong. With json, the message is printed as a JSON log record, for a
// command whose log is JSON (--log-format json).
type exitError struct {
	code    int
	message string
	json    bool
}

// jsonLogged marks err, if it is an exitError, to be printed as a JSON log record.
func jsonLogged(err error) error {
	var exit exitError
	if errors.As(err, &exit) {
		exit.json = true
		return exit
	}
	return err
}

// writeJSONRecord writes one record as slog's JSON handler does, whatever the log level: for what
// a command must say (its final error, the embedded Redis's warning) when its log is JSON.
func writeJSONRecord(w io.Writer, level slog.Level, msg string, attrs ...slog.Attr) {
	rec := slog.NewRecord(time.Now(), level, msg, 0)
	rec.AddAttrs(attrs...)
	_ = slog.NewJSONHandler(w, nil).Handle(context.Background(), rec) // stderr has nowhere better to report to
}

// jsonLogRequested reports whether a command line asks for --log-format json, so that even an
// error in parsing it comes out as JSON.
func jsonLogRequested(args []string) bool {
	for i, a := range args {
		if a == "--log-format=json" || a == "--log-format" && i+1 < len(args) && args[i+1] == "json" {
			return true
		}
	}
	return false
}

func (e exitError) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.message) }

func newRootCommand(stdio IO) *cobra.Command {
	root := &cobra.Command{
		Use:   "flowrun",
		Short: "Declarative stream processing on Redis",
		Long: "flowrun compiles pipelines written in HCL (topics, stages, retries, dead letters) into a graph of " +
			"stages connected by partitioned Redis streams, and runs them.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdio.In)
	root.SetOut(stdio.Out)
	root.SetErr(stdio.Err)
	root.AddCommand(
		newValidateCommand(stdio),
		newFmtCommand(stdio),
		newGraphCommand(stdio),
		newProduceCommand(stdio), newTailCommand(stdio), newInspectCommand(stdio),
		newSchemaCommand(stdio), newEvalCommand(stdio), newTestCommand(stdio),
		newVersionCommand(stdio),
		newRunCommand(stdio),
		newDLQCommand(stdio),
		newResetCommand(stdio), newInitCommand(stdio),
		newBuildCommand(stdio),
	)
	return root
}
