package redis

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// TestDrainStats reads, in one pipeline, each stream's length and last entry and each group's
// pending count and last delivered entry, a stream that does not exist, and whether retry sets
// hold anything.
func TestDrainStats(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s, missing := k.Stream("orders", 0), k.Stream("orders", 1)
		if err := c.EnsureGroup(ctx, s, "read"); err != nil {
			t.Fatal(err)
		}
		if err := c.EnsureGroup(ctx, s, "idle"); err != nil {
			t.Fatal(err)
		}
		first := addRaw(t, c, s, "payload", "1")
		last := addRaw(t, c, s, "payload", "2")
		if b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "read", Consumer: "w", Count: 1, Block: -1}); err != nil || b.Len() != 1 {
			t.Fatalf("read %d entries, %v", b.Len(), err)
		}
		full, empty := k.Retry("orders", 0, "read"), k.Retry("orders", 1, "read")
		if err := c.Universal().ZAdd(ctx, full, goredis.Z{Score: 1, Member: "m"}).Err(); err != nil {
			t.Fatal(err)
		}
		stats, waiting, err := c.DrainStats(ctx, []string{s, missing}, []string{full, empty})
		if err != nil {
			t.Fatal(err)
		}
		st := stats[s]
		if !st.Exists || st.Length != 2 || st.LastID != last {
			t.Errorf("stream: exists %v, length %d, last %q; want true, 2, %q", st.Exists, st.Length, st.LastID, last)
		}
		if g := st.Groups["read"]; g.Pending != 1 || g.LastDeliveredID != first {
			t.Errorf("group read: %+v, want 1 pending, last delivered %s", g, first)
		}
		if g := st.Groups["idle"]; g.Pending != 0 || g.LastDeliveredID != "0-0" {
			t.Errorf("group idle: %+v, want nothing pending, last delivered 0-0", g)
		}
		if m := stats[missing]; m.Exists || len(m.Groups) != 0 {
			t.Errorf("missing stream: %+v, want it absent", m)
		}
		if !waiting[full] || waiting[empty] {
			t.Errorf("retries waiting %v, want only in %s", waiting, full)
		}
	})
}
