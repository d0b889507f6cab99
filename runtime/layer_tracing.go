package runtime

import (
	"context"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// withTracing wraps a message's processing, all attempts, in its span (see tracing.go), which its
// outputs carry on as their parent.
func (r *processing) withTracing(n *node, next messageFunc) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		ctx, span := r.tracing.startProcess(ctx, n, m)
		res, buf, err := next(ctx, m, buf, p)
		r.tracing.endProcess(span, res, err)
		return res, buf, err
	}
}
