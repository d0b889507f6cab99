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
	// DeadLetter, when set, sends the message to the stage's dead letters with this reason instead
	// of to Topic, while the attempt succeeds: a stateful stage's message that was late for some of
	// its windows and counted in others.
	DeadLetter string
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
