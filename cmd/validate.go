package cmd

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
)

func newValidateCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var asJSON bool
	c := &cobra.Command{
		Use:   "validate PATH...",
		Short: "Check pipelines without running them",
		Long: "Validate parses and compiles each pipeline (a file, or a directory of .hcl and .hcl.json files) " +
			"and reports every error and warning with its location.\n\nExit status: 0 when every pipeline is " +
			"valid, 2 when any is invalid.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			report := validateReport{Valid: true, Diagnostics: []flow.JSONDiagnostic{}}
			for _, path := range args {
				plan, cfg, diags := flags.build(path)
				errs, warnings := countDiagnostics(diags)
				report.ErrorCount += errs
				report.WarningCount += warnings
				entry := validatedPipeline{Path: path, Valid: errs == 0}
				if cfg.Pipeline != nil {
					entry.Name = cfg.Pipeline.Name
				}
				report.Pipelines = append(report.Pipelines, entry)
				report.Valid = report.Valid && errs == 0
				if asJSON {
					report.Diagnostics = append(report.Diagnostics, flow.DiagnosticsJSON(diags, cfg.Files())...)
					continue
				}
				printDiagnostics(stdio.Err, diags, cfg.Files())
				if errs == 0 {
					fmt.Fprintf(stdio.Out, "%s: pipeline %q is valid (%s)%s\n", path, plan.Name, summarize(plan), warningNote(warnings))
				} else {
					fmt.Fprintf(stdio.Err, "%s: %d error%s%s\n", path, errs, plural(errs), warningNote(warnings))
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
	Path  string `json:"path"`
	Name  string `json:"name,omitempty"`
	Valid bool   `json:"valid"`
}

// summarize counts a plan's parts for a one-line report.
func summarize(p *flow.Plan) string {
	count := func(n int, what string) string { return fmt.Sprintf("%d %s%s", n, what, plural(n)) }
	return fmt.Sprintf("%s, %s, %s, %s", count(len(p.Sources), "source"), count(len(p.Stages), "stage"),
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
