package redis

import (
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

func TestStreamStats(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("t", 0)
		info, err := c.StreamStats(ctx, s)
		if err != nil || info.Exists {
			t.Fatalf("missing stream: %+v, %v", info, err)
		}
		ids := fill(t, c, s, 50)
		readAndAck(t, c, s, "done", 50)
		readAndAck(t, c, s, "half", 25, 3, 4)
		readAndAck(t, c, s, "none", 0)
		ageEntries(t, c, s, "half", "w", time.Minute, ids[3], ids[4])

		info, err = c.StreamStats(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Exists || info.Length != 50 || info.FirstID != ids[0] || info.LastID != ids[49] {
			t.Fatalf("stream = %+v", info)
		}
		groups := map[string]GroupInfo{}
		for _, g := range info.Groups {
			groups[g.Name] = g
		}
		if len(groups) != 3 {
			t.Fatalf("groups = %+v", info.Groups)
		}
		want := map[string]struct {
			lag, pending int64
			last, oldest string
		}{
			"done": {0, 0, ids[49], ""},
			"half": {25, 2, ids[24], ids[3]},
			"none": {50, 0, "0-0", ""},
		}
		for name, w := range want {
			g := groups[name]
			if g.Lag != w.lag || !g.LagExact || g.Pending != w.pending || g.LastDeliveredID != w.last || g.OldestPendingID != w.oldest {
				t.Errorf("group %s = %+v, want lag %d pending %d last %s oldest %s", name, g, w.lag, w.pending, w.last, w.oldest)
			}
		}
		if h := groups["half"]; h.OldestPendingIdle < 30*time.Second || h.OldestPendingDeliveries != 1 || h.Consumers != 1 {
			t.Errorf("half's oldest pending: %+v", h)
		}
	})
}

func TestStreamStatsLagAfterTrim(t *testing.T) {
	// The counted lag: a group whose last-delivered ID lies before the first entry, in the
	// middle, or at the end.
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("t", 0)
		ids := fill(t, c, s, 30)
		readAndAck(t, c, s, "g", 10)
		info, err := c.StreamStats(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		lag, exact, err := c.countLag(ctx, info, ids[9])
		if err != nil || lag != 20 || !exact {
			t.Fatalf("counted lag = %d, %v, %v; want 20", lag, exact, err)
		}
		if lag, _, _ := c.countLag(ctx, info, ids[29]); lag != 0 {
			t.Fatalf("lag at the end = %d", lag)
		}
		if lag, _, _ := c.countLag(ctx, info, "0-1"); lag != 30 {
			t.Fatalf("lag before the start = %d", lag)
		}
	})
}

// TestMiniredisGaps pins what miniredis (the embedded default) does differently from Redis 7,
// as documented in docs/redis-keys.md. If one of these starts failing, miniredis has closed
// the gap: update the docs.
func TestMiniredisGaps(t *testing.T) {
	c := miniredisBackend().open(t)
	ctx := ctxT(t)
	k := testKeys(t)
	s := k.Stream("t", 0)
	fill(t, c, s, 10)
	readAndAck(t, c, s, "g", 10)

	// XINFO GROUPS reports the stream length as lag and no entries-read (StreamStats counts
	// the lag itself).
	groups, err := c.Universal().XInfoGroups(ctx, s).Result()
	if err != nil || len(groups) != 1 || groups[0].Lag != 10 || groups[0].EntriesRead != 0 {
		t.Fatalf("XINFO GROUPS = %+v, %v", groups, err)
	}
	info, err := c.StreamStats(ctx, s)
	if err != nil || info.Groups[0].Lag != 0 {
		t.Fatalf("StreamStats lag = %+v, %v; want 0", info.Groups, err)
	}

	// XAUTOCLAIM does not return deleted IDs: a pending entry whose stream entry is gone
	// vanishes silently (XPENDING stops counting it, XAUTOCLAIM never reports it).
	addRaw(t, c, s, "payload", "1")
	b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1", Block: -1})
	if err != nil || b.Len() != 1 {
		t.Fatal(b, err)
	}
	ageEntries(t, c, s, "g", "w1", time.Minute)
	if err := c.Universal().XDel(ctx, s, b.IDs()...).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := c.Reclaim(ctx, ReclaimArgs{Stream: s, Group: "g", Consumer: "w2", MinIdle: time.Second})
	if err != nil || len(res.Deleted) != 0 || res.Len() != 0 {
		t.Fatalf("Reclaim = %+v, %v", res, err)
	}
	if n := pending(t, c, s, "g"); n != 0 {
		t.Fatalf("pending = %d; miniredis used to hide the dangling entry", n)
	}

	// INFO has no cluster section (Open treats that as a single server).
	if err := c.Universal().Info(ctx, "cluster").Err(); err == nil {
		t.Fatal("miniredis answers INFO cluster now")
	}

	// XINFO STREAM has only length and last-generated-id (StreamStats uses XRANGE instead).
	xs, err := c.Universal().Do(ctx, "XINFO", "STREAM", s).Slice()
	if err != nil || len(xs) != 4 {
		t.Fatalf("XINFO STREAM = %v, %v", xs, err)
	}
}

func TestBacklog(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		if n, err := c.Backlog(ctx, in, []string{"stage"}); err != nil || n != 0 {
			t.Fatalf("backlog of a missing stream = %d, %v", n, err)
		}
		b := readN(t, c, in, 10) // group "stage" has read all 10
		for i := range 5 {
			addRaw(t, c, in, "payload", fmt.Sprintf(`{"n":%d}`, 10+i))
		}
		if err := c.Ack(ctx, in, "stage", nil, b.IDs()[:4]...); err != nil {
			t.Fatal(err)
		}
		// 6 pending and 5 not delivered; a group that does not exist yet has all 15 ahead of it.
		for _, c2 := range []struct {
			groups []string
			want   int64
		}{{[]string{"stage"}, 11}, {[]string{"stage", "later"}, 15}} {
			if n, err := c.Backlog(ctx, in, c2.groups); err != nil || n != c2.want {
				t.Errorf("Backlog(%v) = %d, %v; want %d", c2.groups, n, err, c2.want)
			}
		}
	})
}

func TestPollReaders(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("t", 0)
		retry := k.Retry("t", 0, "half")
		info, states, err := c.PollReaders(ctx, s, ReaderKeys{Group: "half", RetryKey: retry})
		if err != nil || info.Exists || len(states) != 1 || states[0].Exists || states[0].Lag != 0 {
			t.Fatalf("missing stream: %+v, %+v, %v", info, states, err)
		}
		fill(t, c, s, 10)
		readAndAck(t, c, s, "half", 5, 1, 2)
		if err := c.Universal().ZAdd(ctx, retry, goredis.Z{Score: 1, Member: "a"}).Err(); err != nil {
			t.Fatal(err)
		}
		info, states, err = c.PollReaders(ctx, s, ReaderKeys{Group: "half", RetryKey: retry}, ReaderKeys{Group: "later"})
		if err != nil || info.Length != 10 || len(states) != 2 {
			t.Fatalf("PollReaders = %+v, %+v, %v", info, states, err)
		}
		if h := states[0]; !h.Exists || h.Group.Name != "half" || h.Lag != 5 || h.Pending != 2 || h.Retries != 1 {
			t.Errorf("half = %+v", h)
		}
		if l := states[1]; l.Exists || l.Group.Name != "later" || l.Lag != 10 || l.Pending != 0 || l.Retries != 0 {
			t.Errorf("a group that does not exist yet = %+v", l)
		}
	})
}
