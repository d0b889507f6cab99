package runtime

import (
	"context"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// rateLimiter is a node's stages.RateLimiter: its limits in Redis, on the run's clock.
type rateLimiter struct {
	rdb   *redis.Client
	keys  redis.Keys
	node  string
	clock stages.Clock
}

func (l rateLimiter) Take(ctx context.Context, key string, limit stages.RateLimit) (time.Duration, error) {
	return l.rdb.TakeRate(ctx, l.keys.RateLimit(l.node, key), l.clock.Now(), limit.Interval, limit.Burst)
}
