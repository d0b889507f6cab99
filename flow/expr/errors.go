package expr

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
)

// EvalError is an evaluation failure for one message. Evaluation reports
// every failure as an EvalError value and never panics.
type EvalError struct {
	// Range is the source range of the failing sub-expression.
	Range hcl.Range
	// Expr is the source text of the failing sub-expression (best effort).
	Expr string
	// Message says what went wrong, e.g. `msg has no field "amount"`.
	Message string
}

func (e *EvalError) Error() string {
	if e.Range.Filename == "" && e.Range.Start.Line == 0 {
		return e.Message
	}
	return fmt.Sprintf("%s: %s", e.Range.String(), e.Message)
}

// failf builds an EvalError for node n. It is only called on failure paths,
// so the allocation it makes is never on the fast path.
func (n *node) failf(format string, args ...any) *EvalError {
	return &EvalError{Range: n.rng, Expr: n.src, Message: fmt.Sprintf(format, args...)}
}

// errorDiag is a compile-time error at subject.
func errorDiag(subject hcl.Range, summary, detail string) *hcl.Diagnostic {
	return &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: subject.Ptr()}
}
