package cmd

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/internal/builder"
)

func newBuildCommand(stdio IO) *cobra.Command {
	var (
		with     []string
		output   string
		checkout string
		keep     bool
	)
	c := &cobra.Command{
		Use:   "build --with MODULE[@VERSION|=PATH]... [-o BIN]",
		Short: "Build a flowrun binary with your Go packages' kinds and functions compiled in",
		Long: "build makes a flowrun binary that includes the Go packages given with --with: packages whose init " +
			"registers kinds and stage functions (stages.Register, RegisterSink, ...). It writes a main module in a " +
			"temporary directory (a main.go that blank-imports each package and calls cmd.Main, and a go.mod), runs " +
			"go mod tidy and go build there, and writes the binary to -o. It needs the Go toolchain on PATH.\n\n" +
			"--with MODULE takes the package from its module at the version go mod tidy picks, MODULE@VERSION at that " +
			"version (a tag, a commit, latest), MODULE=PATH from the module in a local directory (MODULE may be a " +
			"package inside it). flowrun itself is the version (or commit) this binary was built from, or the local " +
			"checkout named by --flowrun or FLOWRUN_SOURCE. With only local modules and a module cache holding " +
			"flowrun's dependencies it works offline (GOPROXY=off).",
		Example: "  flowrun build --with example.com/acme=./acme -o ./flowrun-acme\n" +
			"  flowrun build --with github.com/team/flowkinds@v1.4.0 --with example.com/acme=../acme\n" +
			"  FLOWRUN_SOURCE=~/src/flowrun flowrun build --with example.com/acme=.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			var pkgs []builder.Package
			for _, w := range with {
				p, err := builder.ParseWith(w)
				if err != nil {
					return exitError{code: ExitInvalid, message: err.Error()}
				}
				pkgs = append(pkgs, p)
			}
			if len(pkgs) == 0 {
				return exitError{code: ExitInvalid, message: "no packages to build with: give one or more --with MODULE[@VERSION|=PATH]"}
			}
			fr := builder.Flowrun{Dir: checkout}
			if checkout == "" {
				var err error
				if fr, err = builder.RunningFlowrun(); err != nil {
					return exitError{code: ExitInvalid, message: err.Error()}
				}
			}
			err := builder.Build(c.Context(), builder.Options{
				Packages: pkgs, Flowrun: fr, Output: output, KeepWork: keep, Log: stdio.Err,
				LDFlags: versionLDFlags(currentVersion()),
			})
			if errors.As(err, new(builder.InputError)) {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			if err != nil {
				return exitError{code: ExitError, message: err.Error()}
			}
			p := &printer{w: stdio.Out}
			p.printf("wrote %s\n", output)
			return p.err
		},
	}
	c.Flags().StringArrayVar(&with, "with", nil, "a Go package to compile in: MODULE, MODULE@VERSION or MODULE=PATH (repeatable)")
	c.Flags().StringVarP(&output, "output", "o", "flowrun", "the binary to write")
	c.Flags().StringVar(&checkout, "flowrun", "", "a local flowrun checkout to build with (default: $"+builder.EnvSource+", else this binary's version)")
	c.Flags().BoolVar(&keep, "keep", false, "keep the temporary main module, and print its directory")
	return c
}
