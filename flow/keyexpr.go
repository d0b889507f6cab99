package flow

import (
	"errors"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/flowrun/flowrun/flow/expr"
)

// KeyExpr is an expression over msg that computes a message's key, given outside a pipeline (the
// --key of flowrun produce). It has the functions of per-message expressions.
type KeyExpr struct {
	program *expr.Program
	env     expr.Env // reused by Key: a KeyExpr is for one goroutine
}

// CompileKeyExpr parses and compiles src, an expression over msg; name is where it came from
// (a flag, for example), for diagnostics. It returns the file that the diagnostics refer to, to
// print them with their source.
func CompileKeyExpr(name, src string) (*KeyExpr, *hcl.File, hcl.Diagnostics) {
	file := &hcl.File{Bytes: []byte(src)}
	e, diags := hclsyntax.ParseExpression(file.Bytes, name, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, file, diags
	}
	p, more := expr.Compile(e, &expr.Scope{Roots: []string{"msg"}, Functions: expr.Functions(), Source: file.Bytes})
	diags = append(diags, more...)
	if diags.HasErrors() {
		return nil, file, diags
	}
	return &KeyExpr{program: p}, file, diags
}

// Key evaluates the expression on a decoded payload (stages.DecodePayload) and returns the key.
// It is not safe for concurrent use.
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
