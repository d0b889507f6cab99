package cmd

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/stages"
)

func newValidateCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var asJSON bool
	c := &cobra.Command{
		Use:   "validate PATH...",
		Short: "Check pipelines without running them",
		Long: "Validate parses and compiles each pipeline (a file, or a directory of .hcl and .hcl.json files) " +
			"and reports every error and warning with its location. A valid pipeline's test files (.flowtest.hcl " +
			"beside it or in its tests directory) are checked against it too, with their own variables.\n\n" +
			"Exit status: 0 when every pipeline and test file is valid, 2 when any is invalid.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			report := validateReport{Valid: true, Diagnostics: []flow.JSONDiagnostic{}}
			for _, path := range args {
				pipeline := path // a test file is validated with its pipeline
				if flow.IsTestFile(path) {
					pipeline = flow.TestFilePipeline(path)
				}
				plan, cfg, diags := flags.build(pipeline)
				files := cfg.Files()
				var tests []*testfile.File
				if !diags.HasErrors() {
					var testFiles map[string]*hcl.File
					var testDiags hcl.Diagnostics
					tests, testFiles, testDiags = testfile.LoadAndCheck(path, flags.options())
					diags = append(diags, testDiags...)
					files = mergeFiles(files, testFiles)
				}
				errs, warnings := countDiagnostics(diags)
				report.ErrorCount += errs
				report.WarningCount += warnings
				entry := validatedPipeline{Path: path, Valid: errs == 0}
				if errs == 0 {
					entry.State = estimateState(plan)
					entry.Watermarks = plan.WatermarkRules()
				}
				for _, t := range tests {
					entry.Tests = append(entry.Tests, t.Path)
				}
				if cfg.Pipeline != nil {
					entry.Name = cfg.Pipeline.Name
				}
				report.Pipelines = append(report.Pipelines, entry)
				report.Valid = report.Valid && errs == 0
				if asJSON {
					report.Diagnostics = append(report.Diagnostics, flow.DiagnosticsJSON(diags, files)...)
					continue
				}
				printDiagnostics(stdio.Err, diags, files)
				if errs == 0 {
					if _, err := fmt.Fprintf(stdio.Out, "%s: pipeline %q is valid (%s%s)%s\n", path, plan.Name, summarize(plan), testsNote(len(tests)), warningNote(warnings)); err != nil {
						return exitError{code: ExitError, message: err.Error()}
					}
				} else {
					note(stdio.Err, "%s: %d error%s%s\n", path, errs, plural(errs), warningNote(warnings))
				}
			}
			if asJSON {
				enc := json.NewEncoder(stdio.Out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(report); err != nil {
					return exitError{code: ExitError, message: err.Error()}
				}
			}
			if !report.Valid {
				return exitError{code: ExitInvalid}
			}
			return nil
		},
	}
	flags.register(c)
	c.Flags().BoolVar(&asJSON, "json", false, "print the result and every diagnostic as JSON on standard output")
	return c
}

// validateReport is validate's JSON output.
type validateReport struct {
	Valid        bool                  `json:"valid"`
	ErrorCount   int                   `json:"error_count"`
	WarningCount int                   `json:"warning_count"`
	Pipelines    []validatedPipeline   `json:"pipelines"`
	Diagnostics  []flow.JSONDiagnostic `json:"diagnostics"`
}

type validatedPipeline struct {
	Path  string   `json:"path"`
	Name  string   `json:"name,omitempty"`
	Valid bool     `json:"valid"`
	Tests []string `json:"tests,omitempty"` // the test files checked with it
	// State estimates the memory of the state of its dedupe stages, in Redis and in the processes.
	State []stateEstimate `json:"state,omitempty"`
	// Watermarks say how each stateful stage's input gets its watermarks (flow.WatermarkRule).
	Watermarks []flow.WatermarkRule `json:"watermarks,omitempty"`
}

// stateEstimate is what a dedupe stage's state takes in Redis, estimated from the pipeline alone:
// per remembered key (stages.DedupeBytesPerKey, for keys of an assumed length, since their length
// is the data's) and, with max_keys, at most per partition and in all; and what it takes in the
// memory of the process that owns a partition (stages.DedupeProcessBytesPerKey).
type stateEstimate struct {
	Stage       string `json:"stage"`
	Kind        string `json:"kind"`
	Partitions  int    `json:"partitions"`
	BytesPerKey int64  `json:"bytes_per_key"`
	KeyBytes    int    `json:"assumed_key_bytes"`
	Formula     string `json:"formula"`
	MaxKeys     int64  `json:"max_keys,omitempty"`
	// MaxBytesPerPartition is max_keys keys' bytes; MaxBytes that for every partition.
	MaxBytesPerPartition int64 `json:"max_bytes_per_partition,omitempty"`
	MaxBytes             int64 `json:"max_bytes,omitempty"`
	// ProcessBytesPerKey is a remembered key's bytes in the memory of the partition's owner, and
	// MaxProcessBytesPerPartition max_keys keys'.
	ProcessBytesPerKey          int64  `json:"process_bytes_per_key"`
	ProcessFormula              string `json:"process_formula"`
	MaxProcessBytesPerPartition int64  `json:"max_process_bytes_per_partition,omitempty"`
}

func estimateState(p *flow.Plan) []stateEstimate {
	var out []stateEstimate
	for _, s := range p.Stages {
		if s.Kind != "dedupe" || s.Input == nil {
			continue
		}
		e := stateEstimate{
			Stage: s.Name, Kind: s.Kind, Partitions: s.Input.Partitions,
			BytesPerKey: stages.DedupeBytesPerKey(stages.DedupeAssumedKeyLength), KeyBytes: stages.DedupeAssumedKeyLength,
			Formula: stages.DedupeBytesPerKeyFormula, MaxKeys: stages.MaxKeys(s),
			ProcessBytesPerKey: stages.DedupeProcessBytesPerKey(stages.DedupeAssumedKeyLength),
			ProcessFormula:     stages.DedupeProcessBytesPerKeyFormula,
		}
		if e.MaxKeys > 0 {
			e.MaxBytesPerPartition = e.MaxKeys * e.BytesPerKey
			e.MaxBytes = e.MaxBytesPerPartition * int64(e.Partitions)
			e.MaxProcessBytesPerPartition = e.MaxKeys * e.ProcessBytesPerKey
		}
		out = append(out, e)
	}
	return out
}

// mergeFiles returns the parsed files of both maps, for diagnostics that span a pipeline and its tests.
func mergeFiles(a, b map[string]*hcl.File) map[string]*hcl.File {
	out := make(map[string]*hcl.File, len(a)+len(b))
	for _, m := range []map[string]*hcl.File{a, b} {
		for name, f := range m {
			out[name] = f
		}
	}
	return out
}

func testsNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d test file%s", n, plural(n))
}

// summarize counts a plan's parts for a one-line report.
func summarize(p *flow.Plan) string {
	count := func(n int, what string) string { return fmt.Sprintf("%d %s%s", n, what, plural(n)) }
	stages := count(len(p.Stages), "stage")
	if len(p.Chains) > 0 {
		var names []string
		for _, c := range p.Chains {
			names = append(names, c.Name())
		}
		stages += " (fused: " + strings.Join(names, ", ") + ")"
	}
	return fmt.Sprintf("%s, %s, %s, %s", count(len(p.Sources), "source"), stages,
		count(len(p.Sinks), "sink"), count(len(p.Topics), "topic"))
}

func warningNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d warning%s", n, plural(n))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
