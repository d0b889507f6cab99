package redis

import (
	"errors"
	"testing"
	"time"
)

// TestUnblockReads: a group read blocked for an hour returns at once, empty and without an error,
// when the client unblocks its reads, and it has delivered nothing: the entry added afterwards is
// not pending and the next read gets it. Clients that cannot do it (a cluster; miniredis, without
// CLIENT UNBLOCK) say so, and their reads still work.
func TestUnblockReads(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("orders", 0)
		if err := c.EnsureGroup(ctx, s, "g"); err != nil {
			t.Fatal(err)
		}
		if c.IsCluster() || c.isMiniredis(t) {
			if err := c.UnblockReads(ctx); !errors.Is(err, ErrCannotUnblock) {
				t.Fatalf("UnblockReads = %v, want ErrCannotUnblock", err)
			}
			addRaw(t, c, s, "payload", "1")
			if b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1", Block: -1}); err != nil || b.Len() != 1 {
				t.Fatalf("read after UnblockReads: %d entries, %v", b.Len(), err)
			}
			return
		}
		type result struct {
			b   Batch
			err error
		}
		got := make(chan result, 1)
		go func() {
			b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1", Block: time.Hour})
			got <- result{b, err}
		}()
		var r result
		// Until the read has come back: it may not be blocked yet when a round is sent.
		waitFor(t, "the blocked read to return", func() bool {
			if err := c.UnblockReads(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case r = <-got:
				return true
			default:
				return false
			}
		})
		if r.err != nil || r.b.Len() != 0 {
			t.Fatalf("unblocked read returned %d entries, %v; want none and no error", r.b.Len(), r.err)
		}
		id := addRaw(t, c, s, "payload", "2")
		st, err := c.StreamStats(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Groups) != 1 || st.Groups[0].Pending != 0 {
			t.Fatalf("group after the unblocked read: %+v, want nothing pending", st.Groups)
		}
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1", Block: -1})
		if err != nil || b.Len() != 1 || b.Entries[0].ID != id {
			t.Fatalf("next read: %+v, %v; want entry %s", b, err, id)
		}
	})
}
