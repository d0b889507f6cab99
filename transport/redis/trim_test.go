package redis

import (
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// fill appends n entries and returns their IDs.
func fill(t *testing.T, c *Client, stream string, n int) []string {
	t.Helper()
	ctx := ctxT(t)
	pipe := c.Universal().Pipeline()
	cmds := make([]*goredis.StringCmd, n)
	for i := range n {
		cmds[i] = pipe.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"payload", fmt.Sprint(i)}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i, cmd := range cmds {
		ids[i] = cmd.Val()
	}
	return ids
}

// remaining returns the IDs left in a stream.
func remaining(t *testing.T, c *Client, stream string) []string {
	t.Helper()
	msgs, err := c.Universal().XRange(ctxT(t), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// readAndAck makes group deliver n entries to a consumer and acks all but the listed indexes.
func readAndAck(t *testing.T, c *Client, stream, group string, n int, keep ...int) {
	t.Helper()
	ctx := ctxT(t)
	if err := c.EnsureGroup(ctx, stream, group); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return
	}
	b, err := c.ReadGroup(ctx, ReadArgs{Stream: stream, Group: group, Consumer: "w", Count: int64(n), Block: -1})
	if err != nil || b.Len() != n {
		t.Fatalf("read %d, %v; want %d", b.Len(), err, n)
	}
	var ack []string
	for i, id := range b.IDs() {
		kept := false
		for _, k := range keep {
			kept = kept || k == i
		}
		if !kept {
			ack = append(ack, id)
		}
	}
	if err := c.Ack(ctx, stream, group, nil, ack...); err != nil {
		t.Fatal(err)
	}
}

func TestTrimMaxLenWithoutGroups(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		s := k.Stream("t", 0)
		ids := fill(t, c, s, 100)
		res, err := c.Trim(ctxT(t), s, Retention{MaxLen: 40}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if res.Trimmed != 60 || res.Clamped || res.Floor != "" || res.MinID != ids[60] {
			t.Fatalf("Trim = %+v", res)
		}
		if got := remaining(t, c, s); fmt.Sprint(got) != fmt.Sprint(ids[60:]) {
			t.Fatalf("remaining = %d entries from %s", len(got), got[0])
		}
		// Already short enough: nothing to do.
		res, err = c.Trim(ctxT(t), s, Retention{MaxLen: 40}, time.Now())
		if err != nil || res.Trimmed != 0 {
			t.Fatalf("second Trim = %+v, %v", res, err)
		}
	})
}

func TestTrimNeverRemovesUnreadOrPending(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("t", 0)
		ids := fill(t, c, s, 100)
		readAndAck(t, c, s, "fast", 100)     // read and acked everything
		readAndAck(t, c, s, "slow", 30)      // has not read entries 30..99
		readAndAck(t, c, s, "stuck", 60, 20) // entry 20 is still pending
		res, err := c.Trim(ctx, s, Retention{MaxLen: 10}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !res.Clamped || res.Floor != ids[20] || res.Trimmed != 20 {
			t.Fatalf("Trim = %+v, want clamped at %s with 20 trimmed", res, ids[20])
		}
		if got := remaining(t, c, s); fmt.Sprint(got) != fmt.Sprint(ids[20:]) {
			t.Fatalf("remaining starts at %s with %d entries, want %s with 80", got[0], len(got), ids[20])
		}
		// The stuck entry is acked: the floor moves to the slow group's first unread entry.
		if err := c.Ack(ctx, s, "stuck", nil, ids[20]); err != nil {
			t.Fatal(err)
		}
		// The floor is the ID right after the slow group's last-delivered one (ids[29]), which is
		// ids[30] unless the two were made in different milliseconds.
		last, err := parseID(ids[29])
		if err != nil {
			t.Fatal(err)
		}
		res, err = c.Trim(ctx, s, Retention{MaxLen: 10}, time.Now())
		if err != nil || res.Floor != last.next().String() || res.Trimmed != 10 {
			t.Fatalf("Trim = %+v, %v; want floor %s", res, err, last.next())
		}
		// A group that has read nothing protects everything.
		readAndAck(t, c, s, "new", 0)
		res, err = c.Trim(ctx, s, Retention{MaxLen: 1}, time.Now())
		if err != nil || res.Trimmed != 0 || !res.Clamped {
			t.Fatalf("Trim with an unread group = %+v, %v", res, err)
		}
		if n := xlen(t, c, s); n != 70 {
			t.Fatalf("XLEN = %d, want 70", n)
		}
		// Unless the user says so.
		res, err = c.Trim(ctx, s, Retention{MaxLen: 5, IgnoreGroups: true}, time.Now())
		if err != nil || res.Trimmed != 65 {
			t.Fatalf("IgnoreGroups Trim = %+v, %v", res, err)
		}
	})
}

func TestTrimMaxAge(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("t", 0)
		for _, ms := range []int{1000, 2000, 3000, 4000, 5000} {
			if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: s, ID: fmt.Sprintf("%d-0", ms), Values: []any{"payload", "1"}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		now := time.UnixMilli(5500)
		res, err := c.Trim(ctx, s, Retention{MaxAge: 2 * time.Second}, now)
		if err != nil || res.Trimmed != 3 || res.MinID != "3500-0" {
			t.Fatalf("Trim = %+v, %v", res, err)
		}
		if got := remaining(t, c, s); fmt.Sprint(got) != "[4000-0 5000-0]" {
			t.Fatalf("remaining = %v", got)
		}
		// MaxAge and MaxLen together: the stricter wins.
		res, err = c.Trim(ctx, s, Retention{MaxAge: time.Hour, MaxLen: 1}, now)
		if err != nil || res.Trimmed != 1 {
			t.Fatalf("Trim = %+v, %v", res, err)
		}
		// A pending entry stops the age cut too.
		readAndAck(t, c, s, "g", 1, 0)
		res, err = c.Trim(ctx, s, Retention{MaxAge: time.Millisecond}, time.UnixMilli(99999))
		if err != nil || res.Trimmed != 0 || !res.Clamped || res.Floor != "5000-0" {
			t.Fatalf("Trim = %+v, %v", res, err)
		}
	})
}

func TestTrimInSteps(t *testing.T) {
	// More than one step (trimStep entries) to cut: Trim runs rounds until the stream fits.
	forEach(t, []backend{serverBackend(), clusterBackend()}, func(t *testing.T, c *Client, k Keys) {
		s := k.Stream("t", 0)
		ids := fill(t, c, s, 2*trimStep+500)
		res, err := c.Trim(ctxT(t), s, Retention{MaxLen: 100}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if res.Trimmed != int64(len(ids)-100) || res.MinID != ids[len(ids)-100] {
			t.Fatalf("Trim = %+v", res)
		}
		if n := xlen(t, c, s); n != 100 {
			t.Fatalf("XLEN = %d", n)
		}
	})
}

func TestTrimMissingStream(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		res, err := c.Trim(ctxT(t), k.Stream("none", 0), Retention{MaxLen: 1, MaxAge: time.Second}, time.Now())
		if err != nil || res.Trimmed != 0 {
			t.Fatalf("Trim = %+v, %v", res, err)
		}
		res, err = c.Trim(ctxT(t), k.Stream("none", 0), Retention{}, time.Now())
		if err != nil || res != (TrimResult{}) {
			t.Fatalf("Trim without limits = %+v, %v", res, err)
		}
	})
}
