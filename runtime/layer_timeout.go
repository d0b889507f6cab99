package runtime

import (
	"context"
	"errors"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// withTimeout bounds each attempt by the node's timeout, and says so in the error of an attempt
// that ran out of it. Inline nodes (they only compute, or write locally) wait on nothing: no timer
// for them.
func (r *processing) withTimeout(n *node, next attemptFunc) attemptFunc {
	if n.inline {
		return next
	}
	return func(ctx context.Context, m *message, buf []redis.Output) ([]redis.Output, error) {
		ctx, cancel := context.WithTimeout(ctx, n.timeout)
		defer cancel()
		buf, err := next(ctx, m, buf)
		if err != nil && ctx.Err() == context.DeadlineExceeded {
			err = errors.Join(err, errors.New("the attempt took longer than the timeout of "+flow.FormatDuration(n.timeout)))
		}
		return buf, err
	}
}
