package cmd

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
)

func newGraphCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var format string
	c := &cobra.Command{
		Use:   "graph PATH",
		Short: "Print a pipeline's graph as DOT, Mermaid or JSON",
		Long: "Graph compiles a pipeline and prints the graph of its sources, topics, stages and sinks.\n\n" +
			"  flowrun graph examples/pipelines/orders | dot -Tsvg > orders.svg",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if !contains(flow.GraphFormats, format) {
				return exitError{code: ExitInvalid, message: fmt.Sprintf("unknown format %q; use %s", format, strings.Join(flow.GraphFormats, ", "))}
			}
			plan, cfg, diags := flags.build(args[0])
			printDiagnostics(stdio.Err, diags, cfg.Files())
			if diags.HasErrors() {
				return exitError{code: ExitInvalid}
			}
			if err := flow.WriteGraph(stdio.Out, plan, format); err != nil {
				return exitError{code: ExitError, message: err.Error()}
			}
			return nil
		},
	}
	flags.register(c)
	c.Flags().StringVar(&format, "format", "dot", "output format: "+strings.Join(flow.GraphFormats, ", "))
	return c
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
