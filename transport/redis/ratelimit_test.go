package redis

import (
	"sync"
	"testing"
	"time"
)

// A rate limit lets burst messages go at once, then one every interval, at the times the caller
// gives: a message over it waits exactly until its turn, and asking takes nothing from the limit.
func TestTakeRate(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.RateLimit("per_tenant", "acme")
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		const interval, burst = 10 * time.Millisecond, 3
		take := func(at time.Duration) time.Duration {
			t.Helper()
			wait, err := c.TakeRate(ctx, key, t0.Add(at), interval, burst)
			if err != nil {
				t.Fatal(err)
			}
			return wait
		}
		for i := range burst {
			if w := take(0); w != 0 {
				t.Fatalf("message %d of the burst waits %s", i, w)
			}
		}
		for range 3 { // asking again takes nothing
			if w := take(0); w != interval {
				t.Fatalf("the message after the burst waits %s, want %s", w, interval)
			}
		}
		if w := take(4 * time.Millisecond); w != 6*time.Millisecond {
			t.Fatalf("4ms later it waits %s, want 6ms", w)
		}
		if w := take(interval); w != 0 {
			t.Fatalf("at its turn it waits %s", w)
		}
		if w := take(interval); w != interval {
			t.Fatalf("the next waits %s, want %s", w, interval)
		}
		// After a quiet spell the burst is back, and no more.
		for i := range burst {
			if w := take(time.Second); w != 0 {
				t.Fatalf("after a second, message %d of the burst waits %s", i, w)
			}
		}
		if w := take(time.Second); w != interval {
			t.Fatalf("after the second burst it waits %s, want %s", w, interval)
		}
		// Other keys have limits of their own.
		if w, err := c.TakeRate(ctx, k.RateLimit("per_tenant", "other"), t0, interval, 1); err != nil || w != 0 {
			t.Fatalf("another key waits %s (%v)", w, err)
		}
		if _, err := c.TakeRate(ctx, key, t0, 0, 1); err == nil {
			t.Error("an interval of 0 was taken")
		}
	})
}

// Many callers at once (processes sharing a pipeline) never take more than the limit: at one
// instant, exactly burst of them go.
func TestTakeRateConcurrently(t *testing.T) {
	forEach(t, []backend{serverBackend()}, func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.RateLimit("per_tenant", "shared")
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		const callers, burst = 16, 5
		var wg sync.WaitGroup
		var mu sync.Mutex
		went := 0
		for range callers {
			wg.Go(func() {
				for range 10 {
					wait, err := c.TakeRate(ctx, key, now, time.Second/3, burst)
					if err != nil {
						t.Error(err)
						return
					}
					if wait == 0 {
						mu.Lock()
						went++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if went != burst {
			t.Fatalf("%d went at one instant, want the burst, %d", went, burst)
		}
	})
}
