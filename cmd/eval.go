package cmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

func newEvalCommand(stdio IO) *cobra.Command {
	var msgFile string
	c := &cobra.Command{
		Use:   "eval EXPR",
		Short: "Evaluate a per-message expression on a message, as a stage would",
		Long: "Eval compiles EXPR as a stage compiles a per-message expression (where, key, a map's set: msg and " +
			"the functions; not var or local) and evaluates it on one message, a JSON object read from --msg FILE " +
			"or from standard input ({} when standard input is a terminal). It prints the value as JSON, or the " +
			"located error with its snippet. var and local have no value outside a pipeline: write the value in the " +
			"expression, or add it to the message and read it as msg.NAME.\n\n" +
			"Exit status: 0 with the value, 1 when the expression fails on this message (the message a stage " +
			"would dead-letter), 2 when the expression or the message is invalid.",
		Example: "  echo '{\"amount\": 120, \"country\": \"de\"}' | flowrun eval 'msg.amount > 100 && upper(msg.country) == \"DE\"'\n" +
			"  flowrun eval --msg order.json 'msg.amount * 1.19'",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			const name = "EXPR"
			e, file, diags := flow.CompileMessageExpr(name, args[0])
			files := map[string]*hcl.File{name: file}
			if diags.HasErrors() {
				printDiagnostics(stdio.Err, diags, files)
				return exitError{code: ExitInvalid, message: "invalid expression"}
			}
			payload, source, err := readEvalMessage(stdio, msgFile)
			if err != nil {
				return err
			}
			if len(bytes.TrimSpace(payload)) == 0 {
				return exitError{code: ExitInvalid, message: fmt.Sprintf("the message (%s) is empty: give a JSON object", source)}
			}
			msg, err := stages.DecodePayload(bytes.TrimSpace(payload))
			if err != nil {
				return exitError{code: ExitInvalid, message: fmt.Sprintf("the message (%s): %s", source, flow.EvalMessage(err))}
			}
			v, err := e.Eval(msg)
			if err != nil {
				printDiagnostics(stdio.Err, flow.EvalDiagnostics(err), files)
				return exitError{code: ExitError, message: "the expression fails on this message"}
			}
			enc := json.NewEncoder(stdio.Out)
			enc.SetEscapeHTML(false)
			return enc.Encode(v)
		},
	}
	c.Flags().StringVar(&msgFile, "msg", "", "the message: a file holding one JSON object (default: standard input)")
	return c
}

// readEvalMessage reads the message of flowrun eval and says where it came from.
func readEvalMessage(stdio IO, path string) ([]byte, string, error) {
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, "", exitError{code: ExitInvalid, message: fmt.Sprintf("--msg: %v", err)}
		}
		return b, path, nil
	}
	if isTerminal(readerAsWriter(stdio.In)) {
		return []byte("{}"), "none given: {}", nil
	}
	b, err := io.ReadAll(stdio.In)
	if err != nil {
		return nil, "", exitError{code: ExitInvalid, message: fmt.Sprintf("reading the message from standard input: %v", err)}
	}
	return b, "standard input", nil
}

// readerAsWriter lets isTerminal look at standard input: it only needs the file.
func readerAsWriter(r io.Reader) io.Writer {
	if f, ok := r.(*os.File); ok {
		return f
	}
	return io.Discard
}
