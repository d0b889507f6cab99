package expr

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
)

// NonDeterministic are the functions whose value changes from call to call.
var NonDeterministic = []string{"timestamp", "uuid"}

// call compiles a function call. Constant calls never get here (they are
// folded); this is a call with per-message arguments or an impure function.
// try and can are special forms; functions with a native implementation
// run natively; every other function of Scope.Functions runs through cty
// for that call only, with a warning.
func (c *compiler) call(e *hclsyntax.FunctionCallExpr) *node {
	n := c.newNode(e)
	if c.scope.Deterministic && slices.Contains(NonDeterministic, e.Name) {
		c.diags = append(c.diags, errorDiag(e.NameRange, "Function not allowed here",
			fmt.Sprintf("%s() gives another value on every call, and a stateful stage must compute the same on every attempt "+
				"at a message (a retry, a takeover after a crash): use a field of the message, or its event time.", e.Name)))
		return n
	}
	f, ok := c.scope.Functions[e.Name]
	if !ok {
		names := make([]string, 0, len(c.scope.Functions))
		for name := range c.scope.Functions {
			names = append(names, name)
		}
		sort.Strings(names)
		detail := fmt.Sprintf("There is no function named %q.", e.Name)
		if sug := nameSuggestion(e.Name, names); sug != "" {
			detail += fmt.Sprintf(" Did you mean %q?", sug)
		}
		c.diags = append(c.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Call to unknown function", Detail: detail,
			Subject: e.NameRange.Ptr(), Context: e.Range().Ptr(),
		})
		return c.broken(n)
	}
	builtin := isBuiltin(e.Name, f)

	args := make([]*node, len(e.Args))
	for i, a := range e.Args {
		args[i] = c.expr(a)
	}

	if builtin && (e.Name == "try" || e.Name == "can") {
		return c.tryCan(e, n, args)
	}
	if !e.ExpandFinal && !c.checkArgs(e, f, args) {
		return c.broken(n)
	}

	nat, hasNative := natives[e.Name]
	hasNative = hasNative && builtin
	if hasNative {
		n.typ = nat.typ
	} else {
		c.diags = append(c.diags, &hcl.Diagnostic{
			Severity: hcl.DiagWarning,
			Summary:  "Function evaluated through cty",
			Detail: fmt.Sprintf("Function %q has no native implementation for per-message evaluation, so this call will be evaluated through cty (about 10x slower).",
				e.Name),
			Subject: e.Range().Ptr(),
		})
	}
	fb := &fallback{n: n, f: f, name: e.Name, args: args, expand: e.ExpandFinal}

	n.eval = func(env *Env) (Value, *EvalError) {
		vals, err := fb.evalArgs(env)
		if err != nil {
			return Value{}, err
		}
		if hasNative {
			if v, ok := nat.fn(vals); ok {
				return v, nil
			}
		}
		return fb.call(vals)
	}
	return n
}

func isBuiltin(name string, f function.Function) bool {
	Functions() // make sure the table exists
	b, ok := builtins[name]
	return ok && b == f
}

// checkArgs reports a wrong argument count and constant arguments that do
// not convert to their parameter type, like hclsyntax would.
func (c *compiler) checkArgs(e *hclsyntax.FunctionCallExpr, f function.Function, args []*node) bool {
	params, varParam := f.Params(), f.VarParam()
	if len(args) < len(params) {
		qual := ""
		if varParam != nil {
			qual = " at least"
		}
		c.diags = append(c.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Not enough function arguments",
			Detail:  fmt.Sprintf("Function %q expects%s %d argument(s). Missing value for %q.", e.Name, qual, len(params), params[len(args)].Name),
			Subject: e.CloseParenRange.Ptr(), Context: e.Range().Ptr(),
		})
		return false
	}
	if varParam == nil && len(args) > len(params) {
		c.diags = append(c.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Too many function arguments",
			Detail:  fmt.Sprintf("Function %q expects only %d argument(s).", e.Name, len(params)),
			Subject: e.Args[len(params)].StartRange().Ptr(), Context: e.Range().Ptr(),
		})
		return false
	}
	ok := true
	for i, a := range args {
		p := varParam
		if i < len(params) {
			p = &params[i]
		}
		if !a.isConst {
			continue
		}
		if a.val.k == Null {
			if !p.AllowNull {
				c.diags = append(c.diags, &hcl.Diagnostic{
					Severity: hcl.DiagError, Summary: "Invalid function argument",
					Detail:  fmt.Sprintf("Invalid value for %q parameter: argument must not be null.", p.Name),
					Subject: a.rng.Ptr(), Context: e.Range().Ptr(),
				})
				ok = false
			}
			continue
		}
		if _, err := convert.Convert(toCty(a.val), p.Type); err != nil {
			c.diags = append(c.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError, Summary: "Invalid function argument",
				Detail:  fmt.Sprintf("Invalid value for %q parameter: %s.", p.Name, err),
				Subject: a.rng.Ptr(), Context: e.Range().Ptr(),
			})
			ok = false
		}
	}
	return ok
}

// fallback evaluates one call through cty: the way hclsyntax calls
// functions, argument conversion included.
type fallback struct {
	n      *node
	f      function.Function
	name   string
	args   []*node
	expand bool // the last argument is expanded with ...
}

func (fb *fallback) evalArgs(env *Env) ([]Value, *EvalError) {
	vals := make([]Value, 0, len(fb.args))
	for i, a := range fb.args {
		v, err := a.eval(env)
		if err != nil {
			return nil, err
		}
		if fb.expand && i == len(fb.args)-1 {
			switch v.k {
			case List:
				for _, x := range v.list() {
					vals = append(vals, ValueOf(x))
				}
				continue
			case Null:
				return nil, a.failf("the expanding argument (indicated by ...) must not be null")
			default:
				return nil, a.failf("the expanding argument (indicated by ...) must be a list, but it is %s", describe(v))
			}
		}
		vals = append(vals, v)
	}
	return vals, nil
}

func (fb *fallback) call(vals []Value) (Value, *EvalError) {
	params, varParam := fb.f.Params(), fb.f.VarParam()
	if len(vals) < len(params) {
		return Value{}, fb.n.failf("function %q expects %d argument(s), got %d", fb.name, len(params), len(vals))
	}
	if varParam == nil && len(vals) > len(params) {
		return Value{}, fb.n.failf("function %q expects only %d argument(s), got %d", fb.name, len(params), len(vals))
	}
	cvals := make([]cty.Value, len(vals))
	for i, v := range vals {
		p := varParam
		if i < len(params) {
			p = &params[i]
		}
		cv, err := convert.Convert(toCty(v), p.Type)
		if err != nil {
			return Value{}, fb.argNode(i).failf("invalid value for %q parameter of %s(): %s", p.Name, fb.name, err)
		}
		cvals[i] = cv
	}
	res, err := fb.f.Call(cvals)
	if err != nil {
		var argErr function.ArgError
		if errors.As(err, &argErr) && argErr.Index < len(vals) {
			p := varParam
			if argErr.Index < len(params) {
				p = &params[argErr.Index]
			}
			name := "argument"
			if p != nil {
				name = fmt.Sprintf("%q parameter", p.Name)
			}
			return Value{}, fb.argNode(argErr.Index).failf("invalid value for %s of %s(): %s", name, fb.name, err)
		}
		return Value{}, fb.n.failf("call to function %q failed: %s", fb.name, err)
	}
	return fromCty(res), nil
}

// argNode is the node to blame for argument i (arguments expanded from a
// list all blame the list).
func (fb *fallback) argNode(i int) *node {
	if i < len(fb.args) {
		return fb.args[i]
	}
	if len(fb.args) > 0 {
		return fb.args[len(fb.args)-1]
	}
	return fb.n
}

// tryCan compiles the special forms of hcl's ext/tryfunc: try returns the
// first argument that evaluates without error, can whether its argument
// does.
func (c *compiler) tryCan(e *hclsyntax.FunctionCallExpr, n *node, args []*node) *node {
	if e.ExpandFinal {
		c.diags = append(c.diags, errorDiag(e.Range(), "Invalid function call", fmt.Sprintf("%s() does not accept an expanded argument list.", e.Name)))
		return c.broken(n)
	}
	if e.Name == "can" {
		if len(args) != 1 {
			c.diags = append(c.diags, errorDiag(e.Range(), "Wrong number of function arguments", "Function \"can\" expects exactly one argument."))
			return c.broken(n)
		}
		n.typ = tBool
		arg := args[0]
		n.eval = func(env *Env) (Value, *EvalError) {
			_, err := arg.eval(env)
			return boolVal(err == nil), nil
		}
		return n
	}
	if len(args) == 0 {
		c.diags = append(c.diags, errorDiag(e.Range(), "Not enough function arguments", "Function \"try\" expects at least one argument."))
		return c.broken(n)
	}
	n.eval = func(env *Env) (Value, *EvalError) {
		var last *EvalError
		for _, a := range args {
			v, err := a.eval(env)
			if err == nil {
				return v, nil
			}
			last = err
		}
		return Value{}, n.failf("no expression succeeded: the last one failed with: %s", last.Message)
	}
	return n
}
