package flow

import (
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

var variableSpec = &BlockSpec{
	Type:   "variable",
	Labels: []string{"name"},
	Doc: "Declares an input of the pipeline, read as var.NAME. A value comes, from lowest to highest " +
		"precedence, from the default, the environment variable FLOWRUN_VAR_NAME, --var-file files " +
		"and --var NAME=VALUE flags.",
	Attributes: []Attribute{
		{Name: "type", Type: TypeTypeConstraint, Doc: "The value's type, such as string, number, bool, list(string) or map(number); any type when absent."},
		{Name: "default", Type: TypeAny, Doc: "The value when none is given; without a default the variable is required."},
		{Name: "description", Type: TypeString, Doc: "What the variable is for."},
		{
			Name: "sensitive", Type: TypeBool, Default: false,
			Doc: "Marks a secret (a password, a token): its value never appears in logs, errors or graphs.",
		},
	},
}

// varEnvPrefix prefixes the environment variables that set pipeline variables.
const varEnvPrefix = "FLOWRUN_VAR_"

// declaredVariable is a variable block decoded far enough to take values.
type declaredVariable struct {
	block     *Block
	typ       cty.Type
	value     cty.Value // cty.NilVal until a value is known
	sensitive bool
	desc      string
}

// compileVariables decides every variable's value and returns them as the var object.
func (c *compiler) compileVariables() cty.Value {
	vars := map[string]*declaredVariable{}
	var names []string
	for _, b := range c.cfg.Variables {
		v := c.declareVariable(b)
		vars[b.Name] = v
		names = append(names, b.Name)
	}

	// Sources in increasing precedence: each one overrides what came before.
	for _, name := range names {
		if raw, ok := c.lookupEnv(varEnvPrefix + name); ok {
			c.assignRaw(vars[name], raw, fmt.Sprintf("environment variable %s%s", varEnvPrefix, name))
		}
	}
	for _, path := range c.opts.VarFiles {
		c.assignVarFile(vars, names, path)
	}
	for _, assignment := range c.opts.Vars {
		name, raw, ok := strings.Cut(assignment, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			c.diags = c.diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Invalid --var option",
				Detail:   fmt.Sprintf("The option --var %q must have the form NAME=VALUE.", assignment),
			})
			continue
		}
		v, declared := vars[name]
		if !declared {
			c.diags = c.diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Undeclared variable",
				Detail: fmt.Sprintf("The option --var sets %q, but the pipeline declares no such variable.%s",
					name, DidYouMean(name, names)),
			})
			continue
		}
		c.assignRaw(v, raw, "--var "+name)
	}
	c.assignValues(vars, names)

	values := map[string]cty.Value{}
	for _, name := range names {
		v := vars[name]
		if v.value == cty.NilVal {
			c.errorf(v.block.DeclRange, "No value for required variable",
				fmt.Sprintf("The variable %q has no default. Set it with --var %s=VALUE, a --var-file, or the environment variable %s%s.",
					name, name, varEnvPrefix, name))
			v.value = cty.UnknownVal(v.typ) // keeps later checks quiet about this variable
		}
		values[name] = v.value
		c.plan.Variables = append(c.plan.Variables, Variable{
			Name: name, Description: v.desc, Sensitive: v.sensitive, Value: v.value,
		})
	}
	return cty.ObjectVal(values)
}

// declareVariable reads a variable block's type, default, description and sensitivity.
func (c *compiler) declareVariable(b *Block) *declaredVariable {
	v := &declaredVariable{block: b, typ: cty.DynamicPseudoType, value: cty.NilVal}
	if a, ok := b.Attributes["type"]; ok {
		ty, diags := typeexpr.TypeConstraint(a.Expr)
		c.diags = append(c.diags, diags...)
		if !diags.HasErrors() {
			v.typ = ty
		}
	}
	if a, ok := b.Attributes["description"]; ok {
		d, diags := a.Expr.Value(nil)
		c.diags = append(c.diags, diags...)
		if !diags.HasErrors() && d.Type() == cty.String && !d.IsNull() {
			v.desc = d.AsString()
		}
	}
	if a, ok := b.Attributes["sensitive"]; ok {
		s, diags := a.Expr.Value(nil)
		c.diags = append(c.diags, diags...)
		if s, err := convert.Convert(s, cty.Bool); err == nil && !s.IsNull() {
			v.sensitive = s.True()
		} else if !diags.HasErrors() {
			c.errorf(a.Expr.Range(), "Invalid value for sensitive", "The sensitive argument takes true or false.")
		}
	}
	if a, ok := b.Attributes["default"]; ok {
		// A default is a constant: it cannot depend on other variables, which it would precede.
		d, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			c.errorf(a.Expr.Range(), "Invalid default value",
				"A variable's default must be a constant; it cannot refer to variables, locals or functions.")
			return v
		}
		c.convertVariable(v, d, a.Expr.Range().Ptr(), "its default")
	}
	return v
}

// assignRaw gives a variable a value from a command-line flag or the environment. A string variable
// takes the text as it is; any other type parses it as an HCL expression, such as 3 or ["a", "b"].
func (c *compiler) assignRaw(v *declaredVariable, raw, from string) {
	if v.typ == cty.String || v.typ == cty.DynamicPseudoType {
		c.convertVariable(v, cty.StringVal(raw), nil, from)
		return
	}
	e, diags := hclsyntax.ParseExpression([]byte(raw), from, hcl.InitialPos)
	var val cty.Value
	if !diags.HasErrors() {
		val, diags = e.Value(nil)
	}
	if diags.HasErrors() {
		c.diags = c.diags.Append(&hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid value for variable",
			Detail: fmt.Sprintf("The value from %s is not a valid %s: write it as an HCL value, such as 3, true, or [\"a\", \"b\"].",
				from, typeexpr.TypeString(v.typ)),
		})
		return
	}
	c.convertVariable(v, val, nil, from)
}

// assignValues assigns Options.Values, which a test file's variables block gives.
func (c *compiler) assignValues(vars map[string]*declaredVariable, names []string) {
	for _, name := range sortedKeys(c.opts.Values) {
		var subject *hcl.Range
		from := "the given values"
		if rng, ok := c.opts.ValueRanges[name]; ok {
			subject, from = rng.Ptr(), "the variables block"
		}
		v, declared := vars[name]
		if !declared {
			c.diags = c.diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Undeclared variable",
				Detail: fmt.Sprintf("A value is given for %q, but the pipeline declares no such variable.%s",
					name, DidYouMean(name, names)),
				Subject: subject,
			})
			continue
		}
		c.convertVariable(v, c.opts.Values[name], subject, from)
	}
}

// assignVarFile assigns the variables set in a --var-file, an .hcl or .hcl.json file of NAME = VALUE.
func (c *compiler) assignVarFile(vars map[string]*declaredVariable, names []string, path string) {
	src, err := os.ReadFile(path)
	if err != nil {
		c.diags = c.diags.Append(&hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Cannot read variables file",
			Detail:   fmt.Sprintf("--var-file %s: %s.", path, DescribeFSError(err)),
		})
		return
	}
	f, diags := ParseFile(c.cfg.parser, path, src)
	c.diags = append(c.diags, diags...)
	if f == nil || diags.HasErrors() {
		return
	}
	attrs, diags := f.Body.JustAttributes()
	c.diags = append(c.diags, diags...)
	for _, a := range sortedAttributes(attrs) {
		v, declared := vars[a.Name]
		if !declared {
			c.errorf(a.NameRange, "Undeclared variable",
				fmt.Sprintf("The file sets %q, but the pipeline declares no such variable.%s", a.Name, DidYouMean(a.Name, names)))
			continue
		}
		val, diags := a.Expr.Value(nil)
		c.diags = append(c.diags, diags...)
		if !diags.HasErrors() {
			c.convertVariable(v, val, a.Expr.Range().Ptr(), "--var-file "+path)
		}
	}
}

// convertVariable converts a value to the variable's type and keeps it, or reports why it cannot.
func (c *compiler) convertVariable(v *declaredVariable, val cty.Value, subject *hcl.Range, from string) {
	converted, err := convert.Convert(val, v.typ)
	if err != nil {
		subj := subject
		if subj == nil {
			subj = v.block.DeclRange.Ptr()
		}
		c.diags = c.diags.Append(&hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid value for variable",
			Detail: fmt.Sprintf("The value from %s does not suit variable %q: %s.",
				from, v.block.Name, convertErrorText(err, v.typ)),
			Subject: subj,
		})
		if v.value == cty.NilVal {
			v.value = cty.UnknownVal(v.typ) // reported: the variable is not also missing
		}
		return
	}
	v.value = converted
}

// convertErrorText words a conversion error without printing the value, which may be a secret.
func convertErrorText(err error, ty cty.Type) string {
	msg := err.Error()
	if msg == "" {
		return "a " + typeexpr.TypeString(ty) + " is required"
	}
	return msg
}
