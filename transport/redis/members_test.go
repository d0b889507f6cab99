package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

func TestHeartbeatCountsLiveMembers(t *testing.T) {
	for _, b := range []backend{serverBackend(), clusterBackend(), miniredisBackend()} {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			key := testKeys(t).Members() // a key of this run's own: the shared server keeps the last run's
			if n, err := c.Heartbeat(ctx, key, "a", time.Minute); err != nil || n != 1 {
				t.Fatalf("first heartbeat: %d, %v", n, err)
			}
			if n, err := c.Heartbeat(ctx, key, "b", time.Minute); err != nil || n != 2 {
				t.Fatalf("second member: %d, %v", n, err)
			}
			// A member whose membership lapsed is forgotten by the next heartbeat.
			lapsed := goredis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: "dead"}
			if err := c.Universal().ZAdd(ctx, key, lapsed).Err(); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Heartbeat(ctx, key, "a", time.Minute); err != nil || n != 2 {
				t.Fatalf("with a lapsed member: %d, %v", n, err)
			}
			if err := c.Leave(ctx, key, "b"); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Heartbeat(ctx, key, "a", time.Minute); err != nil || n != 1 {
				t.Fatalf("after b left: %d, %v", n, err)
			}
		})
	}
}

func TestMembers(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.Members()
		if ms, err := c.Members(ctx, key); err != nil || len(ms) != 0 {
			t.Fatalf("no members: %+v, %v", ms, err)
		}
		before := time.Now()
		if _, err := c.Heartbeat(ctx, key, "long", time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Heartbeat(ctx, key, "short", time.Minute); err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		lapsed := time.Now().Add(-time.Second).Truncate(time.Millisecond)
		if err := c.Universal().ZAdd(ctx, key, goredis.Z{Score: float64(lapsed.UnixMilli()), Member: "dead"}).Err(); err != nil {
			t.Fatal(err)
		}
		ms, err := c.Members(ctx, key)
		if err != nil || len(ms) != 3 {
			t.Fatalf("members: %+v, %v", ms, err)
		}
		if ms[0].ID != "dead" || ms[1].ID != "short" || ms[2].ID != "long" {
			t.Fatalf("members not in order of expiry: %+v", ms)
		}
		if !ms[0].Expires.Equal(lapsed) {
			t.Errorf("dead expires %v, want %v", ms[0].Expires, lapsed)
		}
		for _, m := range []struct {
			got Member
			ttl time.Duration
		}{{ms[1], time.Minute}, {ms[2], time.Hour}} {
			lo, hi := before.Add(m.ttl).Truncate(time.Millisecond), after.Add(m.ttl)
			if m.got.Expires.Before(lo) || m.got.Expires.After(hi) {
				t.Errorf("%s expires %v, want between %v and %v", m.got.ID, m.got.Expires, lo, hi)
			}
		}
	})
}
