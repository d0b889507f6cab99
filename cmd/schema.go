package cmd

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
)

func newSchemaCommand(stdio IO) *cobra.Command {
	var format string
	var tests bool
	c := &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema of pipeline files, or the language reference",
		Long: "Schema prints the JSON Schema (draft 2020-12) of *.hcl.json pipeline files, for editors, or with " +
			"--format markdown the language reference (docs/reference.md). Both describe the kinds compiled into " +
			"this binary: a custom binary's own kinds too. schema/flowrun.schema.json and docs/reference.md in the " +
			"source tree hold flowrun's. With --tests, the same for test files (*.flowtest.hcl.json; " +
			"schema/flowtest.schema.json and docs/testing-reference.md).",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			var doc []byte
			switch format {
			case "json":
				doc = flow.JSONSchema()
				if tests {
					doc = testfile.JSONSchema()
				}
			case "markdown":
				doc = flow.ReferenceMarkdown()
				if tests {
					doc = testfile.ReferenceMarkdown()
				}
			default:
				return exitError{code: ExitInvalid, message: fmt.Sprintf("--format must be json or markdown, not %q", format)}
			}
			_, err := stdio.Out.Write(doc)
			return err
		},
	}
	c.Flags().StringVar(&format, "format", "json", "json (the JSON Schema) or markdown (the language reference)")
	c.Flags().BoolVar(&tests, "tests", false, "describe the test language (.flowtest.hcl files) instead of the pipeline language")
	return c
}
