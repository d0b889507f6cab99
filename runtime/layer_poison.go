package runtime

import (
	"context"
	"errors"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// poisonDeliveries is how many deliveries of one entry a node tolerates: an entry delivered more often
// was taken by processes that died or lost it each time, and is dead-lettered instead of processed.
const poisonDeliveries = 5

// withPoisonCheck fails for good, unprocessed, an entry delivered more than poisonDeliveries times
// (from a reclaim): every process that took it died or lost it, and the next one would too.
func (r *processing) withPoisonCheck(_ *node, next messageFunc) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		if m.deliveries > poisonDeliveries {
			err := stages.Permanent(errors.New("delivered " + itoa(m.deliveries) +
				" times without being acknowledged: every process that took it died or lost it (a poison message)"))
			return result{}, buf, &failedForGood{err: err, attempts: m.attempts, firstFailure: r.clock.Now()}
		}
		return next(ctx, m, buf, p)
	}
}
