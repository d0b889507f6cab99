package redis

import (
	"fmt"
	"github.com/alicebob/miniredis/v2"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ageEntries makes pending entries look idle for d without waiting: XCLAIM to the same
// consumer with IDLE and JUSTID, which sets the idle time and leaves the delivery count alone.
// (Redis 7's XCLAIM also drops IDs whose entries are gone, so age entries before deleting any.)
// miniredis counts a JUSTID claim as a delivery, so there its clock is moved forward instead,
// which ages every pending entry.
func ageEntries(t *testing.T, c *Client, stream, group, consumer string, d time.Duration, ids ...string) {
	t.Helper()
	if m, ok := minis.Load(c); ok {
		mr := m.(*miniredis.Miniredis)
		mr.SetTime(time.Now().Add(d))
		return
	}
	args := []any{"XCLAIM", stream, group, consumer, 0}
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, "IDLE", d.Milliseconds(), "JUSTID")
	if err := c.Universal().Do(ctxT(t), args...).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestReclaimKilledConsumer(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		b := readN(t, c, in, 25) // w1 reads 25 entries and is killed: it never acks
		ageEntries(t, c, in, "stage", "w1", time.Minute, b.IDs()...)
		// w2 has in-flight work of its own, which must not be stolen.
		addRaw(t, c, in, "payload", `"fresh"`)
		fresh, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w2", Block: -1})
		if err != nil || len(fresh.Entries) != 1 {
			t.Fatalf("w2 read %+v, %v", fresh, err)
		}

		var got []Entry
		res := ReclaimResult{Next: "0-0"}
		pages := 0
		for {
			res, err = c.Reclaim(ctx, ReclaimArgs{Stream: in, Group: "stage", Consumer: "w2", MinIdle: 30 * time.Second, PageSize: 10, MaxPages: 1, Start: res.Next})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			got = append(got, res.Entries...)
			if res.Next == "0-0" {
				break
			}
			if pages > 10 {
				t.Fatal("cursor never returned to 0-0")
			}
		}
		if len(got) != 25 {
			t.Fatalf("reclaimed %d entries, want 25", len(got))
		}
		for i, e := range got {
			if e.ID != b.Entries[i].ID || string(e.Payload) != string(b.Entries[i].Payload) {
				t.Fatalf("entry %d = %+v, want %+v", i, e, b.Entries[i])
			}
			if e.Deliveries != 2 {
				t.Fatalf("entry %s has delivery count %d, want 2", e.ID, e.Deliveries)
			}
		}
		// All 26 pending entries now belong to w2; the fresh one was not claimed (not idle).
		pend, err := c.Universal().XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: in, Group: "stage", Start: "-", End: "+", Count: 100}).Result()
		if err != nil || len(pend) != 26 {
			t.Fatalf("pending = %d, %v", len(pend), err)
		}
		for _, p := range pend {
			if p.Consumer != "w2" {
				t.Fatalf("entry %s still pending for %s", p.ID, p.Consumer)
			}
			if p.ID == fresh.Entries[0].ID && p.RetryCount != 1 {
				t.Fatalf("the fresh entry was claimed: %+v", p)
			}
		}
	})
}

func TestReclaimDeliveriesAmongOwnPending(t *testing.T) {
	// The claiming consumer has its own pending entries interleaved with the claimed ones: the
	// delivery-count lookup pages past them.
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		if err := c.EnsureGroup(ctx, in, "stage"); err != nil {
			t.Fatal(err)
		}
		var stale []string
		for i := range 40 {
			addRaw(t, c, in, "payload", fmt.Sprint(i))
			consumer := "w2"
			if i%4 == 0 {
				consumer = "w1"
			}
			b, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: consumer, Block: -1})
			if err != nil || b.Len() != 1 {
				t.Fatal(b, err)
			}
			if consumer == "w1" {
				stale = append(stale, b.IDs()...)
			}
		}
		ageEntries(t, c, in, "stage", "w1", time.Minute, stale...)
		res, err := c.Reclaim(ctx, ReclaimArgs{Stream: in, Group: "stage", Consumer: "w2", MinIdle: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Entries) != 10 || !res.Redelivered {
			t.Fatalf("reclaimed %d, want 10 marked as delivered before (%v)", len(res.Entries), res.Redelivered)
		}
		for _, e := range res.Entries {
			if e.Deliveries != 2 {
				t.Fatalf("%s: deliveries %d, want 2", e.ID, e.Deliveries)
			}
		}
	})
}

func TestReclaimReportsTrimmedWhilePending(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		b := readN(t, c, in, 6)
		ageEntries(t, c, in, "stage", "w1", time.Minute, b.IDs()...)
		// Entries 0 and 3 are deleted while pending (as a MAXLEN trim or XDEL would).
		gone := []string{b.Entries[0].ID, b.Entries[3].ID}
		if err := c.Universal().XDel(ctx, in, gone...).Err(); err != nil {
			t.Fatal(err)
		}
		res, err := c.Reclaim(ctx, ReclaimArgs{Stream: in, Group: "stage", Consumer: "w2", MinIdle: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(res.Deleted) != fmt.Sprint(gone) {
			t.Fatalf("deleted = %v, want %v", res.Deleted, gone)
		}
		if len(res.Entries) != 4 {
			t.Fatalf("claimed %d entries, want 4", len(res.Entries))
		}
		// XAUTOCLAIM removed the deleted IDs from the PEL.
		if n := pending(t, c, in, "stage"); n != 4 {
			t.Fatalf("pending = %d, want 4", n)
		}
	})
}

func TestReclaimMalformed(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		if err := c.EnsureGroup(ctx, in, "stage"); err != nil {
			t.Fatal(err)
		}
		bad := addRaw(t, c, in, "payload", "{{")
		if _, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w1", Block: -1}); err != nil {
			t.Fatal(err)
		}
		ageEntries(t, c, in, "stage", "w1", time.Minute, bad)
		res, err := c.Reclaim(ctx, ReclaimArgs{Stream: in, Group: "stage", Consumer: "w2", MinIdle: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Malformed) != 1 || res.Malformed[0].ID != bad {
			t.Fatalf("malformed = %+v", res.Malformed)
		}
	})
}

func TestReclaimRejectsZeroIdle(t *testing.T) {
	c := miniredisBackend().open(t)
	for _, idle := range []time.Duration{0, time.Microsecond, -time.Second} {
		_, err := c.Reclaim(ctxT(t), ReclaimArgs{Stream: "s", Group: "g", Consumer: "c", MinIdle: idle})
		if err == nil || !strings.Contains(err.Error(), "below 1ms") {
			t.Errorf("MinIdle %v: err = %v", idle, err)
		}
	}
}

func TestDeleteIdleConsumerKeepsPending(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		b := readN(t, c, in, 3)
		gone, err := c.DeleteIdleConsumer(ctx, in, "stage", "w1")
		if err != nil || gone {
			t.Fatalf("deleting a consumer with pending entries: %v, %v", gone, err)
		}
		if n := pending(t, c, in, "stage"); n != 3 {
			t.Fatalf("pending = %d, want 3", n)
		}
		if err := c.Ack(ctx, in, "stage", nil, b.IDs()...); err != nil {
			t.Fatal(err)
		}
		gone, err = c.DeleteIdleConsumer(ctx, in, "stage", "w1")
		if err != nil || !gone {
			t.Fatalf("deleting an idle consumer: %v, %v", gone, err)
		}
		cons, err := c.Universal().XInfoConsumers(ctx, in, "stage").Result()
		if err != nil || len(cons) != 0 {
			t.Fatalf("consumers = %+v, %v", cons, err)
		}
	})
}

// TestTakingBackOwnEntriesIsNoDelivery: a consumer that reads its own pending entries again
// (ReadPending) or claims them back (Reclaim, as a process does that took a lost lease again)
// leaves their delivery counts as they were; another consumer's claim counts one more.
func TestTakingBackOwnEntriesIsNoDelivery(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		if err := c.EnsureGroup(ctx, in, "stage"); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			addRaw(t, c, in, "payload", fmt.Sprint(i))
		}
		if _, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w1", Block: -1}); err != nil {
			t.Fatal(err)
		}
		counts := func() []int64 {
			t.Helper()
			pend, err := c.Universal().XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: in, Group: "stage", Start: "-", End: "+", Count: 10}).Result()
			if err != nil {
				t.Fatal(err)
			}
			var n []int64
			for _, p := range pend {
				n = append(n, p.RetryCount)
			}
			return n
		}
		for i := range 3 {
			b, err := c.ReadPending(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w1", Count: 10}, "")
			if err != nil || len(b.Entries) != 3 || b.Entries[0].Deliveries != 1 {
				t.Fatalf("read again: %d entries, deliveries %v, %v", len(b.Entries), b.Entries, err)
			}
			ageEntries(t, c, in, "stage", "w1", time.Duration(i+1)*time.Second, streamIDs(t, c, in)...) // later each time on miniredis's clock
			res, err := c.Reclaim(ctx, ReclaimArgs{Stream: in, Group: "stage", Consumer: "w1", MinIdle: time.Millisecond})
			if err != nil || len(res.Entries) != 3 || res.Entries[0].Deliveries != 1 {
				t.Fatalf("claimed back: %d entries (%+v), %v; counts %v", len(res.Entries), res.Entries, err, counts())
			}
		}
		if got := fmt.Sprint(counts()); got != "[1 1 1]" {
			t.Fatalf("after three reads and claims of its own entries, delivery counts %s, want [1 1 1]", got)
		}
		ageEntries(t, c, in, "stage", "w1", time.Minute, streamIDs(t, c, in)...)
		res, err := c.Reclaim(ctx, ReclaimArgs{Stream: in, Group: "stage", Consumer: "w2", MinIdle: 30 * time.Second})
		if err != nil || len(res.Entries) != 3 || res.Entries[0].Deliveries != 2 {
			t.Fatalf("another consumer's claim: %d entries, %v", len(res.Entries), err)
		}
		if got := fmt.Sprint(counts()); got != "[2 2 2]" {
			t.Fatalf("after another consumer's claim, delivery counts %s, want [2 2 2]", got)
		}
	})
}

// streamIDs returns the IDs of the stream's entries.
func streamIDs(t *testing.T, c *Client, stream string) []string {
	t.Helper()
	msgs, err := c.Universal().XRange(ctxT(t), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.ID)
	}
	return ids
}
