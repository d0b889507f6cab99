package cmd

import (
	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// pipelineFlags are the flags of every command that compiles a pipeline.
type pipelineFlags struct {
	vars     []string
	varFiles []string
}

func (f *pipelineFlags) register(c *cobra.Command) {
	c.Flags().StringArrayVar(&f.vars, "var", nil, "set a pipeline variable, as NAME=VALUE (repeatable)")
	c.Flags().StringArrayVar(&f.varFiles, "var-file", nil, "read pipeline variables from an .hcl or .hcl.json file of NAME = VALUE (repeatable)")
}

// build loads and compiles the pipeline at path with the flags' variables and this binary's Go
// stage functions.
func (f *pipelineFlags) build(path string) (*flow.Plan, *flow.Config, hcl.Diagnostics) {
	return flow.Build(path, flow.Options{
		Vars:     f.vars,
		VarFiles: f.varFiles,
		GoFuncs:  stages.Names(),
	})
}
