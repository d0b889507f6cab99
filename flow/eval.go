package flow

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"

	"github.com/flowrun/flowrun/flow/expr"
)

// Config-time expressions are evaluated once, when the pipeline compiles. They may use var.NAME,
// local.NAME, path.pipeline (the pipeline's directory), path.cwd, and every function of Functions.

// configRoots are the root variables of config-time expressions.
var configRoots = []string{"var", "local", "path"}

// newEvalContext returns the context for config-time expressions; variables and locals are added as
// they are compiled.
func (c *compiler) newEvalContext() *hcl.EvalContext {
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "."
	}
	// As given (relative to the working directory when the pipeline's path was), like Terraform's
	// path.module: plans and graphs then read the same on every machine.
	dir := filepath.Clean(c.cfg.Dir)
	return &hcl.EvalContext{
		Variables: map[string]cty.Value{
			"var":   cty.EmptyObjectVal,
			"local": cty.EmptyObjectVal,
			"path": cty.ObjectVal(map[string]cty.Value{
				"pipeline": cty.StringVal(dir),
				"cwd":      cty.StringVal(cwd),
			}),
		},
		Functions: Functions(c.lookupEnv),
	}
}

// Functions is the function table of every expression: the per-message library of package expr plus
// env() and file(), which read the environment and files at compile time.
func Functions(lookupEnv func(string) (string, bool)) map[string]function.Function {
	fns := expr.Functions()
	fns["env"] = function.New(&function.Spec{
		Description: "The value of an environment variable, or the default when it is not set.",
		Params:      []function.Parameter{{Name: "name", Type: cty.String}},
		VarParam:    &function.Parameter{Name: "default", Type: cty.String},
		Type:        function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			name := args[0].AsString()
			if v, ok := lookupEnv(name); ok {
				return cty.StringVal(v), nil
			}
			switch len(args) {
			case 1:
				return cty.NilVal, fmt.Errorf("the environment variable %s is not set; give a default as env(%q, \"default\")", name, name)
			case 2:
				return args[1], nil
			}
			return cty.NilVal, fmt.Errorf("env takes a name and at most one default")
		},
	})
	fns["file"] = function.New(&function.Spec{
		Description: "The contents of a file, as a string. A relative path is relative to the working directory; use path.pipeline for files next to the pipeline.",
		Params:      []function.Parameter{{Name: "path", Type: cty.String}},
		Type:        function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			b, err := os.ReadFile(args[0].AsString())
			if err != nil {
				return cty.NilVal, fmt.Errorf("cannot read %s: %s", args[0].AsString(), DescribeFSError(err))
			}
			return cty.StringVal(string(b)), nil
		},
	})
	return fns
}

func (c *compiler) lookupEnv(name string) (string, bool) {
	if c.opts.LookupEnv != nil {
		return c.opts.LookupEnv(name)
	}
	return os.LookupEnv(name)
}

// messageScope is the scope of a per-message expression with the given roots.
// attributeScope is the scope of an attribute's per-message expressions.
func (c *compiler) attributeScope(spec Attribute) *expr.Scope {
	s := c.messageScope(spec.Roots)
	s.Deterministic = spec.Deterministic
	return s
}

func (c *compiler) messageScope(roots []string) *expr.Scope {
	return &expr.Scope{
		Roots: roots,
		Constants: map[string]cty.Value{
			"var":   c.ctx.Variables["var"],
			"local": c.ctx.Variables["local"],
			"path":  c.ctx.Variables["path"],
		},
		Functions: c.ctx.Functions,
	}
}
