package cmd

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
)

func newSchemaCommand(stdio IO) *cobra.Command {
	var format string
	var tests bool
	c := &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema of pipeline files or the language reference; infer a topic's schema",
		Long: "Schema prints the JSON Schema (draft 2020-12) of *.hcl.json pipeline files, for editors, or with " +
			"--format markdown the language reference (docs/reference.md). Both describe the kinds compiled into " +
			"this binary: a custom binary's own kinds too. schema/flowrun.schema.json and docs/reference.md in the " +
			"source tree hold flowrun's. With --tests, the same for test files (*.flowtest.hcl.json; " +
			"schema/flowtest.schema.json and docs/testing-reference.md).\n\n" +
			"flowrun schema infer FILE proposes the schema of a topic's messages from samples (see its --help).",
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
	c.AddCommand(newSchemaInferCommand(stdio))
	return c
}

func newSchemaInferCommand(stdio IO) *cobra.Command {
	return &cobra.Command{
		Use:   "infer FILE",
		Short: "Propose a topic's JSON Schema from sample messages (JSON lines)",
		Long: "Infer reads sample messages, one JSON object a line, from FILE (- for standard input) and prints a " +
			"JSON Schema (draft 2020-12) that they all satisfy, for a topic's schema attribute: each field's types " +
			"(integer where every number was whole, null among them where a null appeared), the fields present in " +
			"every message as required, nested objects and the items of arrays alike. It is a proposal: edit it " +
			"where the samples say more than the messages will (a field that happened to be always there) or less.",
		Example: "  flowrun schema infer samples.jsonl > examples/pipelines/orders/order.schema.json\n" +
			"  redis-cli --raw XRANGE ... | flowrun schema infer -",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			in, name := stdio.In, "stdin"
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return exitError{code: ExitInvalid, message: fmt.Sprintf("cannot read %s: %s", args[0], flow.DescribeFSError(err))}
				}
				defer func() { _ = f.Close() }()
				in, name = f, args[0]
			}
			doc, err := flow.InferMessageSchema(in, name)
			if err != nil {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			_, err = stdio.Out.Write(doc)
			return err
		},
	}
}
