package runtime

import (
	"context"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
	"math/rand/v2"
	"strconv"
	"time"
)

// backoff spaces out attempts to reach Redis after failures: 100ms, doubling, up to 5s.
type backoff struct{ next time.Duration }

const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

func (b *backoff) wait(ctx context.Context, clock stages.Clock) {
	if b.next < backoffMin {
		b.next = backoffMin
	}
	t := clock.NewTimer(jittered(b.next, 0.2))
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
	b.next = min(2*b.next, backoffMax)
}

func (b *backoff) reset() { b.next = 0 }

// jittered shortens d by a random fraction of up to jitter, so that retries of many messages spread.
func jittered(d time.Duration, jitter float64) time.Duration {
	if jitter <= 0 || d <= 0 {
		return d
	}
	return d - time.Duration(float64(d)*jitter*rand.Float64())
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// redisClock gives transport/redis the run's clock.
type redisClock struct{ stages.Clock }

func (c redisClock) NewTimer(d time.Duration) redis.Timer { return c.Clock.NewTimer(d) }
