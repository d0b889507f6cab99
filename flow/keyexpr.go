package flow

import (
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/flowrun/flowrun/flow/expr"
)

// MessageExpr is an expression over msg given outside a pipeline (flowrun eval, the --key of
// flowrun produce), compiled as a stage compiles its per-message expressions, with their functions.
// It is for one goroutine at a time.
type MessageExpr struct {
	program *expr.Program
	env     expr.Env
}

// CompileMessageExpr parses and compiles src, an expression over msg; name is where it came from
// (a flag, for example), for diagnostics. It returns the file that the diagnostics refer to, to
// print them with their source.
func CompileMessageExpr(name, src string) (*MessageExpr, *hcl.File, hcl.Diagnostics) {
	file := &hcl.File{Bytes: []byte(src)}
	e, diags := hclsyntax.ParseExpression(file.Bytes, name, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, file, diags
	}
	if diags = pipelineValueRefs(e); diags.HasErrors() {
		return nil, file, diags
	}
	p, more := expr.Compile(e, &expr.Scope{Roots: []string{"msg"}, Functions: expr.Functions(), Source: file.Bytes})
	diags = append(diags, more...)
	if diags.HasErrors() {
		return nil, file, diags
	}
	return &MessageExpr{program: p}, file, diags
}

// pipelineValueRefs reports each var.NAME and local.NAME in e, an expression given outside a
// pipeline: there is no pipeline to give them values, and "Unknown variable" would leave the user
// guessing why a name that works in a stage does not work here.
func pipelineValueRefs(e hcl.Expression) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, t := range e.Variables() {
		root := t.RootName()
		if root != "var" && root != "local" {
			continue
		}
		ref, name := root, "value"
		if len(t) > 1 {
			if a, ok := t[1].(hcl.TraverseAttr); ok {
				ref, name = root+"."+a.Name, a.Name
			}
		}
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("%s is not available outside a pipeline", root),
			Detail: fmt.Sprintf("This expression is evaluated on a message alone, outside a pipeline, so %s has no value: "+
				"only msg and the functions are available. Write the value in place of %s, or add it to the message "+
				"(\"%s\": ...) and write msg.%s.", ref, ref, name, name),
			Subject: t.SourceRange().Ptr(),
		})
	}
	return diags
}

// CompileHCLMessageExpr compiles an expression over msg that a file holds (a test file's mock
// output, in native or JSON syntax), with the functions of pipelines; src is the file's text, which
// diagnostics and evaluation errors quote. The diagnostics are located in that file.
func CompileHCLMessageExpr(e hcl.Expression, src []byte) (*MessageExpr, hcl.Diagnostics) {
	p, diags := expr.Compile(e, &expr.Scope{Roots: []string{"msg"}, Functions: Functions(os.LookupEnv), Source: src})
	if diags.HasErrors() {
		return nil, diags
	}
	return &MessageExpr{program: p}, diags
}

// Eval evaluates the expression on a decoded payload (stages.DecodePayload) and returns its value
// as a JSON-ready Go value, as a map stage's set would write it. It reuses scratch space of m: one
// goroutine at a time (give each goroutine its own MessageExpr).
func (m *MessageExpr) Eval(msg any) (any, error) {
	m.env.Msg = msg
	v, err := m.program.Eval(&m.env)
	if err != nil {
		return nil, err
	}
	return v.Interface(), nil
}

// Clone returns a MessageExpr of the same compiled expression for another goroutine: the compiled
// program is shared, the scratch space is not.
func (m *MessageExpr) Clone() *MessageExpr { return &MessageExpr{program: m.program} }

// KeyExpr is a MessageExpr that computes a message's key.
type KeyExpr struct{ MessageExpr }

// CompileKeyExpr compiles a key expression: see CompileMessageExpr.
func CompileKeyExpr(name, src string) (*KeyExpr, *hcl.File, hcl.Diagnostics) {
	m, file, diags := CompileMessageExpr(name, src)
	if m == nil {
		return nil, file, diags
	}
	return &KeyExpr{*m}, file, diags
}

// Key evaluates the expression on a decoded payload and returns the key, which must be a string.
func (k *KeyExpr) Key(msg any) (string, error) {
	k.env.Msg = msg
	return k.program.EvalString(&k.env)
}

// EvalMessage returns an expression's evaluation error without its position: what went wrong, as
// in `msg has no field "user"`. Other errors are returned as they read.
func EvalMessage(err error) string {
	var e *expr.EvalError
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

// EvalDiagnostics turns an expression's evaluation error into a diagnostic located at the
// sub-expression that failed, to print with its snippet.
func EvalDiagnostics(err error) hcl.Diagnostics {
	var e *expr.EvalError
	if errors.As(err, &e) && e.Range.Filename != "" {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Expression failed on this message",
			Detail: e.Message + ".", Subject: e.Range.Ptr()}}
	}
	return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Expression failed on this message", Detail: err.Error()}}
}
