package redis

import (
	"errors"
	"testing"
	"time"
)

// TestLeasesInOnePipeline: AcquireLeases takes the free leases and reports the held one with its
// holder and its time left; ReleaseLeases frees what it holds and refuses a lease it no longer holds; on a cluster
// the keys live on different nodes.
func TestLeasesInOnePipeline(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		keys := []string{k.Lease("orders", 0, "enrich"), k.Lease("orders", 1, "enrich"), k.Lease("orders", 2, "enrich")}
		other, ok, err := c.AcquireLease(ctx, keys[1], "other", time.Minute)
		if err != nil || !ok {
			t.Fatalf("taking %s for another owner: %v %v", keys[1], ok, err)
		}
		res, err := c.AcquireLeases(ctx, keys, "me", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 3 {
			t.Fatalf("%d results, want 3", len(res))
		}
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("%s: %v", keys[i], r.Err)
			}
		}
		if !res[0].Taken || !res[2].Taken || res[1].Taken {
			t.Fatalf("taken %v %v %v, want true false true", res[0].Taken, res[1].Taken, res[2].Taken)
		}
		if res[1].Lease != other {
			t.Errorf("held lease reported as %v, want the other owner's %v", res[1].Lease, other)
		}
		// The holder's time left tells the others when to look again.
		if ttl := res[1].TTL; ttl <= 0 || ttl > time.Minute {
			t.Errorf("held lease reported with %s left, want up to a minute", ttl)
		}
		for _, i := range []int{0, 2} {
			if l, _, held, err := c.LeaseHolder(ctx, keys[i]); err != nil || !held || l != res[i].Lease || l.Owner != "me" {
				t.Errorf("%s is held by %v (held %v, %v), want %v", keys[i], l, held, err, res[i].Lease)
			}
		}
		// The first lease is taken over meanwhile: releasing it must not free the new holder's.
		if err := c.ReleaseLease(ctx, res[0].Lease); err != nil {
			t.Fatal(err)
		}
		newer, ok, err := c.AcquireLease(ctx, keys[0], "newer", time.Minute)
		if err != nil || !ok {
			t.Fatalf("taking %s again: %v %v", keys[0], ok, err)
		}
		errs := c.ReleaseLeases(ctx, []Lease{res[0].Lease, res[2].Lease})
		if !errors.Is(errs[0], ErrLeaseLost) || errs[1] != nil {
			t.Fatalf("ReleaseLeases = %v, want [lease lost, nil]", errs)
		}
		if l, _, held, err := c.LeaseHolder(ctx, keys[0]); err != nil || !held || l != newer {
			t.Errorf("%s is held by %v (held %v, %v) after a stale release, want %v", keys[0], l, held, err, newer)
		}
		if _, _, held, err := c.LeaseHolder(ctx, keys[2]); err != nil || held {
			t.Errorf("%s is still held (%v) after its release", keys[2], err)
		}
	})
}

// TestLeaseHoldersInOnePipeline: LeaseHolders reads the holder and time left of several leases at
// once, on whichever nodes their keys live: a held one, a free one, and a key whose value is no
// lease, which has an error of its own while the others are read.
func TestLeaseHoldersInOnePipeline(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		keys := []string{k.Lease("orders", 0, "enrich"), k.Lease("orders", 1, "enrich"), k.Lease("orders", 2, "enrich")}
		held, ok, err := c.AcquireLease(ctx, keys[0], "me", time.Minute)
		if err != nil || !ok {
			t.Fatalf("taking %s: %v %v", keys[0], ok, err)
		}
		if err := c.Universal().Set(ctx, keys[2], "no lease", 0).Err(); err != nil {
			t.Fatal(err)
		}
		got := c.LeaseHolders(ctx, keys)
		if len(got) != 3 {
			t.Fatalf("%d results, want 3", len(got))
		}
		if h := got[0]; h.Err != nil || !h.Held || h.Lease != held || h.TTL <= 0 || h.TTL > time.Minute {
			t.Errorf("%s: %+v, want held by %v for up to a minute", keys[0], h, held)
		}
		if h := got[1]; h.Err != nil || h.Held {
			t.Errorf("%s: %+v, want free", keys[1], h)
		}
		if h := got[2]; h.Err == nil || h.Held {
			t.Errorf("%s: %+v, want an error for a value that is no lease", keys[2], h)
		}
	})
}

// TestRenewLeasesInOnePipeline: RenewLeases extends the leases still held, on whichever nodes
// their keys live, and refuses the one another owner took meanwhile, leaving it to that owner.
func TestRenewLeasesInOnePipeline(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		keys := []string{k.Lease("orders", 0, "enrich"), k.Lease("orders", 1, "enrich"), k.Lease("orders", 2, "enrich")}
		res, err := c.AcquireLeases(ctx, keys, "me", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ReleaseLease(ctx, res[1].Lease); err != nil {
			t.Fatal(err)
		}
		other, ok, err := c.AcquireLease(ctx, keys[1], "other", time.Second)
		if err != nil || !ok {
			t.Fatalf("taking %s for another owner: %v %v", keys[1], ok, err)
		}
		errs := c.RenewLeases(ctx, []Lease{res[0].Lease, res[1].Lease, res[2].Lease}, time.Hour)
		if errs[0] != nil || !errors.Is(errs[1], ErrLeaseLost) || errs[2] != nil {
			t.Fatalf("RenewLeases = %v, want [nil, lease lost, nil]", errs)
		}
		for i, want := range []time.Duration{time.Hour, time.Second, time.Hour} {
			l, ttl, held, err := c.LeaseHolder(ctx, keys[i])
			if err != nil || !held || ttl <= want-time.Minute/2 || ttl > want {
				t.Errorf("%s: held %v by %v for %s (%v), want for about %s", keys[i], held, l, ttl, err, want)
			}
			if i == 1 && l != other {
				t.Errorf("%s is held by %v, want the other owner's %v", keys[i], l, other)
			}
		}
	})
}

// TestDeleteIdleConsumers removes the consumer from the groups where it holds nothing and keeps it
// where it has a pending entry.
func TestDeleteIdleConsumers(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		idle, busy := k.Stream("orders", 0), k.Stream("orders", 1)
		for _, s := range []string{idle, busy} {
			if err := c.EnsureGroup(ctx, s, "g"); err != nil {
				t.Fatal(err)
			}
			addRaw(t, c, s, "payload", "1")
		}
		// "me" reads and acks on idle, reads and holds on busy.
		for _, s := range []string{idle, busy} {
			b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "me", Count: 10, Block: -1})
			if err != nil || b.Len() != 1 {
				t.Fatalf("reading %s: %d entries, %v", s, b.Len(), err)
			}
			if s == idle {
				if err := c.Ack(ctx, s, "g", nil, b.IDs()...); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := c.DeleteIdleConsumers(ctx, []GroupRef{{idle, "g"}, {busy, "g"}}, "me"); err != nil {
			t.Fatal(err)
		}
		for s, want := range map[string]int{idle: 0, busy: 1} {
			consumers, err := c.Universal().XInfoConsumers(ctx, s, "g").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(consumers) != want {
				t.Errorf("%s has %d consumers, want %d", s, len(consumers), want)
			}
		}
	})
}
