package runtime

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// backoff spaces out attempts to reach Redis after failures: 100ms, doubling, up to 5s.
type backoff struct{ next time.Duration }

const (
	backoffFirst = 100 * time.Millisecond
	backoffMax   = 5 * time.Second
)

func (b *backoff) wait(ctx context.Context, clock stages.Clock, j *jitter) {
	if b.next < backoffFirst {
		b.next = backoffFirst
	}
	t := clock.NewTimer(j.jittered(b.next, 0.2))
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
	b.next = min(2*b.next, backoffMax)
}

func (b *backoff) reset() { b.next = 0 }

// jitter draws the random fractions of retry and backoff delays from the run's generator
// (Options.Rand), under a lock. The runner embeds it.
type jitter struct {
	randMu sync.Mutex // guards rand
	rand   *rand.Rand
}

// jittered shortens d by a random fraction of up to jitter, so that retries of many messages spread.
func (j *jitter) jittered(d time.Duration, jitter float64) time.Duration {
	if jitter <= 0 || d <= 0 {
		return d
	}
	j.randMu.Lock()
	f := j.rand.Float64()
	j.randMu.Unlock()
	return d - time.Duration(float64(d)*jitter*f)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// redisClock gives transport/redis the run's clock.
type redisClock struct{ stages.Clock }

func (c redisClock) NewTimer(d time.Duration) redis.Timer { return c.Clock.NewTimer(d) }
