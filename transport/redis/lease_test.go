package redis

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestLeaseRace(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.Lease("orders", 2, "enrich")
		const owners = 8
		var wg sync.WaitGroup
		won := make(chan Lease, owners)
		lost := make(chan Lease, owners)
		for i := range owners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, ok, err := c.AcquireLease(ctx, key, fmt.Sprintf("owner-%d", i), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					won <- l
				} else {
					lost <- l
				}
			}()
		}
		wg.Wait()
		close(won)
		close(lost)
		if len(won) != 1 || len(lost) != owners-1 {
			t.Fatalf("%d owners won the race, %d lost; want exactly 1 winner", len(won), len(lost))
		}
		winner := <-won
		for l := range lost {
			if l != winner {
				t.Fatalf("a loser sees holder %+v, the winner is %+v", l, winner)
			}
		}
		// redis-cli users can read who holds it.
		v, err := c.Universal().Get(ctx, key).Result()
		if err != nil || v != winner.Value() || v != fmt.Sprintf("%s#%d", winner.Owner, winner.Token) {
			t.Fatalf("GET %s = %q, %v; want %q", key, v, err, winner.Value())
		}
		holder, ttl, ok, err := c.LeaseHolder(ctx, key)
		if err != nil || !ok || holder != winner || ttl <= 0 || ttl > time.Minute {
			t.Fatalf("LeaseHolder = %+v, %v, %v, %v", holder, ttl, ok, err)
		}
		// Not re-entrant: the holder itself gets false (and renews instead).
		if _, ok, _ := c.AcquireLease(ctx, key, winner.Owner, time.Minute); ok {
			t.Fatal("AcquireLease by the holder succeeded")
		}
	})
}

func TestLeaseExpiryHandsOver(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.Lease("orders", 0, "enrich")
		a, ok, err := c.AcquireLease(ctx, key, "a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := c.RenewLease(ctx, a, time.Minute); err != nil {
			t.Fatalf("the holder cannot renew: %v", err)
		}
		forceExpire(t, c, key)
		b, ok, err := c.AcquireLease(ctx, key, "b", time.Minute)
		if err != nil || !ok {
			t.Fatalf("b could not take an expired lease: %v, %v", ok, err)
		}
		if b.Token <= a.Token {
			t.Fatalf("fencing token did not grow: a=%d b=%d", a.Token, b.Token)
		}
		// The stale owner can neither renew nor release, and b's lease is untouched.
		if err := c.RenewLease(ctx, a, time.Minute); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale renew: %v", err)
		}
		if err := c.ReleaseLease(ctx, a); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale release: %v", err)
		}
		// Same owner name, old token: still stale.
		if err := c.ReleaseLease(ctx, Lease{Key: key, Owner: "b", Token: a.Token}); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("release with an old token: %v", err)
		}
		if holder, _, ok, _ := c.LeaseHolder(ctx, key); !ok || holder != b {
			t.Fatalf("holder = %+v, %v; want %+v", holder, ok, b)
		}
		if err := c.ReleaseLease(ctx, b); err != nil {
			t.Fatal(err)
		}
		if _, _, ok, _ := c.LeaseHolder(ctx, key); ok {
			t.Fatal("lease still held after release")
		}
		// After a release the next owner takes it at once, with a larger token.
		a2, ok, err := c.AcquireLease(ctx, key, "a", time.Minute)
		if err != nil || !ok || a2.Token <= b.Token {
			t.Fatalf("re-acquire: %+v, %v, %v", a2, ok, err)
		}
	})
}

func TestLeaseShortTTLExpires(t *testing.T) {
	// A real expiry, not a forced one: a 20ms lease lapses by itself.
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.Lease("orders", 1, "enrich")
		if _, ok, err := c.AcquireLease(ctx, key, "a", 20*time.Millisecond); err != nil || !ok {
			t.Fatal(ok, err)
		}
		waitFor(t, "the lease to lapse", func() bool {
			_, ok, err := c.AcquireLease(ctx, key, "b", time.Minute)
			return err == nil && ok
		})
	})
}

func TestLeaseArguments(t *testing.T) {
	c := miniredisBackend().open(t)
	ctx := ctxT(t)
	if _, _, err := c.AcquireLease(ctx, "k", "", time.Second); err == nil {
		t.Error("empty owner accepted")
	}
	if _, _, err := c.AcquireLease(ctx, "k", "o", time.Microsecond); err == nil {
		t.Error("ttl below 1ms accepted")
	}
	if err := c.RenewLease(ctx, Lease{Key: "k", Owner: "o", Token: 1}, 0); err == nil {
		t.Error("renew with ttl 0 accepted")
	}
	if err := c.Universal().Set(ctx, "junk", "no-token", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.LeaseHolder(ctx, "junk"); err == nil {
		t.Error("LeaseHolder parsed a value without a token")
	}
	// An owner name may contain '#'.
	l, ok, err := c.AcquireLease(ctx, "k2", "host#1", time.Second)
	if err != nil || !ok || l.Owner != "host#1" {
		t.Fatalf("owner with #: %+v, %v, %v", l, ok, err)
	}
}
