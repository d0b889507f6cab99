package cmd

import (
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
)

func newSchemaCommand(stdio IO) *cobra.Command {
	return &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema of pipeline files in JSON syntax",
		Long: "Schema prints the JSON Schema (draft 2020-12) of *.hcl.json pipeline files, for editors. " +
			"schema/flowrun.schema.json in the source tree holds the same document.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			_, err := stdio.Out.Write(flow.JSONSchema())
			return err
		},
	}
}
