package cmd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/runtime/flowtest"
	"github.com/flowrun/flowrun/stages"
)

// testFlags are the flags of flowrun test.
type testFlags struct {
	pipeline pipelineFlags
	run      string
	seed     int64
	update   bool
	verbose  bool
	asJSON   bool
	junit    string
	log      string
}

func newTestCommand(stdio IO) *cobra.Command {
	var f testFlags
	c := &cobra.Command{
		Use:   "test PATH...",
		Short: "Run a pipeline's tests (*.flowtest.hcl) on an embedded Redis and a virtual clock",
		Long: "Test finds the test files of each pipeline (PATH is a pipeline file or directory, or a test file): " +
			"NAME.flowtest.hcl and NAME.flowtest.hcl.json beside the pipeline's files and in a tests/ directory under " +
			"them. It runs their run blocks in order on an embedded Redis and a virtual clock, with nothing to start, " +
			"and reports every expectation that failed with its location and a diff. See docs/testing.md.\n\n" +
			"Exit status: 0 when every test passed, 1 when any failed, 2 when a pipeline or test file is invalid " +
			"(nothing runs then).",
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if !c.Flags().Changed("seed") {
				f.seed = rand.Int64N(1 << 31)
			}
			return runTests(c.Context(), stdio, f, args)
		},
	}
	f.pipeline.register(c)
	c.Flags().StringVar(&f.run, "run", "", "run only the runs whose FILE/RUN name matches this regular expression (with the runs they build on)")
	c.Flags().Int64Var(&f.seed, "seed", 0, "seed the jitter of retries: a failed test prints its seed, and -seed N replays it (default: random)")
	c.Flags().BoolVar(&f.update, "update", false, "rewrite the golden files of expect { file = ... } with what arrived, instead of comparing")
	c.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "print every message that arrived at every sink and topic")
	c.Flags().BoolVar(&f.asJSON, "json", false, "print one JSON event per line on standard output instead of text")
	c.Flags().StringVar(&f.junit, "junit-xml", "", "also write a JUnit XML report to this file (one testcase per run)")
	c.Flags().StringVar(&f.log, "log", "", "write the pipeline's debug log to this file")
	return c
}

// goStyleTestFlags lets flowrun test take its flags with one dash, as go test does (-run X,
// -junit-xml FILE): they become --run X and --junit-xml FILE.
func goStyleTestFlags(args []string) []string {
	if len(args) == 0 || args[0] != "test" {
		return args
	}
	long := []string{"run", "seed", "update", "verbose", "json", "junit-xml", "log", "var", "var-file"}
	out := append([]string(nil), args...)
	for i, a := range out {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		for _, l := range long {
			if name == l {
				out[i] = "-" + a
			}
		}
	}
	return out
}

// runTests checks every test file first, and runs them only when all are valid.
func runTests(ctx context.Context, stdio IO, f testFlags, paths []string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	var only *regexp.Regexp
	if f.run != "" {
		re, err := regexp.Compile(f.run)
		if err != nil {
			return exitError{code: ExitInvalid, message: fmt.Sprintf("-run: %v", err)}
		}
		only = re
	}
	type testFile struct {
		*testfile.File
		sources map[string]*hcl.File // the pipeline's and the test file's, for snippets
	}
	var files []testFile
	seen := map[string]bool{}
	invalid := false
	for _, path := range paths {
		tests, sources, diags := testfile.LoadAndCheck(path, flow.Options{
			Vars: f.pipeline.vars, VarFiles: f.pipeline.varFiles, GoFuncs: stages.Names(),
		})
		printDiagnostics(stdio.Err, diags, sources)
		if diags.HasErrors() {
			invalid = true
			continue
		}
		if len(tests) == 0 {
			if _, err := fmt.Fprintf(stdio.Out, "%s: no test files (NAME.flowtest.hcl beside the pipeline or in its tests/ directory)\n", path); err != nil {
				return exitError{code: ExitError, message: err.Error()}
			}
			continue
		}
		for _, t := range tests {
			if !seen[filepath.Clean(t.Path)] { // examples/* may name a pipeline and its test file
				seen[filepath.Clean(t.Path)] = true
				files = append(files, testFile{t, sources})
			}
		}
	}
	if invalid {
		return exitError{code: ExitInvalid}
	}

	opts := flowtest.Options{Seed: f.seed, Run: only, Update: f.update}
	if f.log != "" {
		logFile, err := os.Create(f.log)
		if err != nil {
			return exitError{code: ExitError, message: fmt.Sprintf("--log: %v", err)}
		}
		defer func() { _ = logFile.Close() }()
		opts.Log = logFile
	}
	var jsonOut *flowtest.JSONReporter
	if f.asJSON {
		jsonOut = flowtest.NewJSONReporter(stdio.Out)
	}
	var results []*flowtest.RunResult
	for _, tf := range files {
		for _, r := range flowtest.RunFile(ctx, tf.File, tf.Plan, opts) {
			results = append(results, r)
			if jsonOut != nil {
				jsonOut.Run(r)
			} else if err := flowtest.WriteText(stdio.Out, r, tf.sources, f.verbose); err != nil {
				return exitError{code: ExitError, message: err.Error()}
			}
		}
	}
	if jsonOut != nil {
		jsonOut.Done(results)
	} else if err := flowtest.WriteTextSummary(stdio.Out, results, f.seed); err != nil {
		return exitError{code: ExitError, message: err.Error()}
	}
	if f.junit != "" {
		if err := writeJUnitFile(f.junit, results); err != nil {
			return exitError{code: ExitError, message: fmt.Sprintf("--junit-xml: %v", err)}
		}
	}
	for _, r := range results {
		if !r.Passed() {
			return exitError{code: ExitError}
		}
	}
	return nil
}

func writeJUnitFile(path string, results []*flowtest.RunResult) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := flowtest.WriteJUnit(out, results); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
