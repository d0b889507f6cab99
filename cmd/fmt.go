package cmd

import (
	"fmt"
	"os"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
)

func newFmtCommand(stdio IO) *cobra.Command {
	var check, write bool
	c := &cobra.Command{
		Use:   "fmt [--check | -w] PATH...",
		Short: "Format pipeline files in the canonical style",
		Long: "Fmt prints each .hcl file of the given pipelines in the canonical style. With -w it rewrites the " +
			"files that change instead; with --check it only lists them. JSON-syntax files are left alone.\n\n" +
			"Exit status: 0 when done (with --check: when every file is formatted), 1 when --check found files " +
			"to format, 2 on syntax errors.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if check && write {
				return exitError{code: ExitInvalid, message: "--check and -w exclude each other"}
			}
			var diags hcl.Diagnostics
			files := map[string]*hcl.File{}
			unformatted := 0
			for _, path := range args {
				names, d := flow.FormatFiles(path)
				diags = append(diags, d...)
				for _, name := range names {
					src, err := os.ReadFile(name)
					if err != nil {
						return exitError{code: ExitError, message: err.Error()}
					}
					out, d := flow.Format(name, src)
					if d.HasErrors() {
						diags = append(diags, d...)
						files[name] = &hcl.File{Bytes: src}
						continue
					}
					changed := string(out) != string(src)
					switch {
					case check:
						if changed {
							unformatted++
							if _, err := fmt.Fprintln(stdio.Out, name); err != nil {
								return exitError{code: ExitError, message: err.Error()}
							}
						}
					case write:
						if changed {
							if err := writeFileKeepMode(name, out); err != nil {
								return exitError{code: ExitError, message: err.Error()}
							}
							if _, err := fmt.Fprintln(stdio.Out, name); err != nil {
								return exitError{code: ExitError, message: err.Error()}
							}
						}
					default:
						if _, err := stdio.Out.Write(out); err != nil {
							return exitError{code: ExitError, message: err.Error()}
						}
					}
				}
			}
			printDiagnostics(stdio.Err, diags, files)
			if diags.HasErrors() {
				return exitError{code: ExitInvalid}
			}
			if unformatted > 0 {
				return exitError{code: ExitError, message: fmt.Sprintf("%d file%s not formatted; run flowrun fmt -w", unformatted, plural(unformatted))}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&check, "check", false, "list the files whose formatting differs and exit 1 if there are any")
	c.Flags().BoolVarP(&write, "write", "w", false, "rewrite files in place")
	return c
}

// writeFileKeepMode replaces a file's contents, keeping its permissions.
func writeFileKeepMode(name string, data []byte) error {
	info, err := os.Stat(name)
	if err != nil {
		return err
	}
	return os.WriteFile(name, data, info.Mode().Perm())
}
