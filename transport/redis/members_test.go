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
			k := testKeys(t) // keys of this run's own: the shared server keeps the last run's
			all, node := k.Members(), k.NodeMembers("work")
			beat := func(member string, keys ...string) []int {
				t.Helper()
				m, err := c.Heartbeat(ctx, keys, member, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return m.Live
			}
			if n := beat("a", all, node); n[0] != 1 || n[1] != 1 {
				t.Fatalf("first heartbeat: %v", n)
			}
			// b runs another node: it counts in the pipeline's set, not in work's.
			if n := beat("b", all); n[0] != 2 {
				t.Fatalf("second member: %v", n)
			}
			// A member whose membership lapsed is forgotten by the next heartbeat.
			lapsed := goredis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: "dead"}
			if err := c.Universal().ZAdd(ctx, node, lapsed).Err(); err != nil {
				t.Fatal(err)
			}
			if n := beat("a", all, node); n[0] != 2 || n[1] != 1 {
				t.Fatalf("with a lapsed member: %v", n)
			}
			if err := c.Leave(ctx, []string{all}, "b"); err != nil {
				t.Fatal(err)
			}
			if n := beat("a", all, node); n[0] != 1 || n[1] != 1 {
				t.Fatalf("after b left: %v", n)
			}
		})
	}
}

// TestHeartbeatTellsTheNextLapse: a heartbeat reports when the soonest other member lapses, in any
// of its sets, never itself; with no other member, nothing.
func TestHeartbeatTellsTheNextLapse(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		all, node := k.Members(), k.NodeMembers("work")
		alone, err := c.Heartbeat(ctx, []string{all, node}, "me", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !alone.NextLapse.IsZero() {
			t.Errorf("alone: the next lapse is %v, want none", alone.NextLapse)
		}
		soon := time.Now().Add(time.Minute).Truncate(time.Millisecond)
		for key, m := range map[string]goredis.Z{
			all:  {Score: float64(soon.Add(time.Hour).UnixMilli()), Member: "late"},
			node: {Score: float64(soon.UnixMilli()), Member: "soon"},
		} {
			if err := c.Universal().ZAdd(ctx, key, m).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// Its own membership lapses first (a second), the others' after: the soonest other's.
		got, err := c.Heartbeat(ctx, []string{all, node}, "me", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !got.NextLapse.Equal(soon) || got.Live[0] != 2 || got.Live[1] != 2 {
			t.Errorf("heartbeat = %+v, want the next lapse at %v and 2 members in each set", got, soon)
		}
	})
}

func TestMembers(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.Members()
		if ms, err := c.Members(ctx, key); err != nil || len(ms) != 0 {
			t.Fatalf("no members: %+v, %v", ms, err)
		}
		before := time.Now()
		if _, err := c.Heartbeat(ctx, []string{key}, "long", time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Heartbeat(ctx, []string{key}, "short", time.Minute); err != nil {
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
