package stages

import (
	"errors"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// Output is a message and the topic it goes to.
type Output struct {
	Topic   *flow.Topic
	Message Message
}

// evalError makes an expression's evaluation error permanent: the same message would fail the
// same way on every attempt.
func evalError(err error) error {
	var ee *expr.EvalError
	if errors.As(err, &ee) {
		return Permanent(err)
	}
	return err
}
