package runtime

import (
	"context"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
	"strconv"
	"time"
)

// backoff spaces out attempts to reach Redis after failures: 100ms, doubling, up to 5s.
type backoff struct{ next time.Duration }

const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

func (b *backoff) wait(ctx context.Context, r *runner) {
	if b.next < backoffMin {
		b.next = backoffMin
	}
	t := r.clock.NewTimer(r.jittered(b.next, 0.2))
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
	b.next = min(2*b.next, backoffMax)
}

func (b *backoff) reset() { b.next = 0 }

// jittered shortens d by a random fraction of up to jitter, so that retries of many messages spread.
func (r *runner) jittered(d time.Duration, jitter float64) time.Duration {
	if jitter <= 0 || d <= 0 {
		return d
	}
	r.randMu.Lock()
	f := r.opts.Rand.Float64()
	r.randMu.Unlock()
	return d - time.Duration(float64(d)*jitter*f)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// redisClock gives transport/redis the run's clock.
type redisClock struct{ stages.Clock }

func (c redisClock) NewTimer(d time.Duration) redis.Timer { return c.Clock.NewTimer(d) }
