package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// addRaw appends an entry with raw fields, as another application would.
func addRaw(t *testing.T, c *Client, stream string, kv ...any) string {
	t.Helper()
	id, err := c.Universal().XAdd(ctxT(t), &goredis.XAddArgs{Stream: stream, Values: kv}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestEnsureGroupIsIdempotent(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("orders", 0)
		addRaw(t, c, s, "payload", `1`)
		for range 2 {
			if err := c.EnsureGroup(ctx, s, "enrich"); err != nil {
				t.Fatal(err)
			}
		}
		// Created at 0: the entry written before the group is delivered.
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "enrich", Consumer: "w1", Block: -1})
		if err != nil || len(b.Entries) != 1 {
			t.Fatalf("ReadGroup = %+v, %v", b, err)
		}
		// MKSTREAM: a group on a stream that does not exist yet.
		if err := c.EnsureGroup(ctx, k.Stream("new", 0), "enrich"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestReadGroupSortsEntries(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("orders", 0)
		if err := c.EnsureGroup(ctx, s, "g"); err != nil {
			t.Fatal(err)
		}
		good := addRaw(t, c, s, "payload", `{"a":1}`, "key", "k")
		bad := addRaw(t, c, s, "payload", `{"a":`)
		flat := addRaw(t, c, s, "type", "order.placed", "order_id", "42")
		badHeaders := addRaw(t, c, s, "payload", `1`, "headers", `nope`)
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Entries) != 2 || b.Entries[0].ID != good || b.Entries[1].ID != flat || !b.Entries[1].Flat {
			t.Fatalf("entries = %+v", b.Entries)
		}
		if len(b.Malformed) != 2 || b.Malformed[0].ID != bad || b.Malformed[1].ID != badHeaders {
			t.Fatalf("malformed = %+v", b.Malformed)
		}
		if b.Len() != 4 || len(b.IDs()) != 4 {
			t.Fatalf("Len = %d, IDs = %v", b.Len(), b.IDs())
		}
		// All four are pending: nothing was dropped.
		if n, _ := c.Universal().XPending(ctx, s, "g").Result(); n.Count != 4 {
			t.Fatalf("pending = %d, want 4", n.Count)
		}
		// Nothing new: a non-blocking read returns an empty batch, no error.
		b, err = c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1", Block: -1})
		if err != nil || b.Len() != 0 {
			t.Fatalf("empty read = %+v, %v", b, err)
		}
	})
}

func TestReadGroupBlocksUntilEntry(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("orders", 0)
		if err := c.EnsureGroup(ctx, s, "g"); err != nil {
			t.Fatal(err)
		}
		type result struct {
			b   Batch
			err error
		}
		got := make(chan result, 1)
		go func() {
			b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1", Block: 20 * time.Second})
			got <- result{b, err}
		}()
		// Wait until the reader is parked on the server, then write.
		waitFor(t, "the blocked reader", func() bool { return blockedClients(t, c) > 0 })
		addRaw(t, c, s, "payload", `7`)
		r := <-got
		if r.err != nil || len(r.b.Entries) != 1 || string(r.b.Entries[0].Payload) != "7" {
			t.Fatalf("blocked read got %+v, %v", r.b, r.err)
		}
	})
}

func TestReadArgsLimits(t *testing.T) {
	c := miniredisBackend().open(t)
	ctx := ctxT(t)
	if _, err := c.ReadGroup(ctx, ReadArgs{Stream: "s", Group: "g", Consumer: "c", Count: 1001}); err == nil {
		t.Error("Count 1001 accepted")
	}
	if _, err := c.ReadGroup(ctx, ReadArgs{Stream: "s", Group: "g"}); err == nil {
		t.Error("missing consumer accepted")
	}
}

func TestReadPendingRecoversOwnEntries(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("orders", 0)
		if err := c.EnsureGroup(ctx, s, "g"); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i := range 5 {
			ids = append(ids, addRaw(t, c, s, "payload", fmt.Sprint(i)))
		}
		if _, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1"}); err != nil {
			t.Fatal(err)
		}
		// Another consumer's pending entries are not ours.
		addRaw(t, c, s, "payload", `99`)
		if _, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w2"}); err != nil {
			t.Fatal(err)
		}
		// One of w1's entries is deleted while pending.
		if err := c.Universal().XDel(ctx, s, ids[2]).Err(); err != nil {
			t.Fatal(err)
		}
		// w1 restarts and pages through its own PEL, 2 at a time.
		var got []string
		var deleted []string
		after := ""
		for {
			b, err := c.ReadPending(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w1", Count: 2}, after)
			if err != nil {
				t.Fatal(err)
			}
			if b.Len() == 0 {
				break
			}
			if !b.Redelivered {
				t.Fatal("entries read again are not marked as delivered before")
			}
			for _, e := range b.Entries {
				got = append(got, e.ID)
			}
			deleted = append(deleted, b.Deleted...)
			all := b.IDs()
			after = maxOf(t, all)
		}
		if fmt.Sprint(got) != fmt.Sprint([]string{ids[0], ids[1], ids[3], ids[4]}) {
			t.Fatalf("recovered %v, want %v without %s", got, ids, ids[2])
		}
		if c.isMiniredis(t) {
			// miniredis leaves deleted entries out of the reply instead of returning them
			// with no fields (docs/redis-keys.md, "miniredis").
			if len(deleted) != 0 {
				t.Fatalf("deleted = %v on miniredis", deleted)
			}
			return
		}
		if len(deleted) != 1 || deleted[0] != ids[2] {
			t.Fatalf("deleted = %v, want [%s]", deleted, ids[2])
		}
	})
}

func maxOf(t *testing.T, ids []string) string {
	t.Helper()
	best := ids[0]
	for _, id := range ids[1:] {
		if c, err := CompareIDs(id, best); err != nil {
			t.Fatal(err)
		} else if c > 0 {
			best = id
		}
	}
	return best
}

func TestReadGroupNoGroupAfterDelete(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("orders", 0)
		if err := c.EnsureGroup(ctx, s, "g"); err != nil {
			t.Fatal(err)
		}
		c.Universal().Del(ctx, s)
		_, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w", Block: -1})
		if !errors.Is(err, ErrNoGroup) || !strings.Contains(err.Error(), s) {
			t.Fatalf("err = %v", err)
		}
	})
}

// blockedClients counts the clients blocked in a command over all nodes.
func blockedClients(t *testing.T, c *Client) int {
	t.Helper()
	ctx := ctxT(t)
	var total atomic.Int64
	count := func(ctx context.Context, r *goredis.Client) error {
		info, err := r.Info(ctx, "clients").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
				n, _ := strconv.Atoi(v)
				total.Add(int64(n))
			}
		}
		return nil
	}
	var err error
	if cc, ok := c.Universal().(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, count)
	} else {
		err = count(ctx, c.Universal().(*goredis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
	return int(total.Load())
}

// TestMaxEntrySize: a client with a limit reports every larger entry as malformed, with its size,
// in group reads, in the recovery read, in a reclaim and in due retries; the unlimited client on
// the same connections decodes it.
func TestMaxEntrySize(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("orders", 0)
		if err := c.EnsureGroup(ctx, s, "g"); err != nil {
			t.Fatal(err)
		}
		big := `{"blob":"` + strings.Repeat("x", 4000) + `"}`
		small := addRaw(t, c, s, "payload", `{"a":1}`)
		large := addRaw(t, c, s, "payload", big)
		limited := c.WithMaxEntrySize(1000)
		isTooLarge := func(b Batch) bool {
			return len(b.Entries) == 1 && b.Entries[0].ID == small && len(b.Malformed) == 1 && b.Malformed[0].ID == large &&
				strings.Contains(b.Malformed[0].Reason, "entry is 4018 bytes (3.9 KiB), larger than the limit of 1000 bytes")
		}
		args := ReadArgs{Stream: s, Group: "g", Consumer: "w1", Block: -1}
		b, err := limited.ReadGroup(ctx, args)
		if err != nil || !isTooLarge(b) {
			t.Fatalf("ReadGroup = %+v, %v; want the large entry malformed", b, err)
		}
		if b, err = limited.ReadPending(ctx, args, ""); err != nil || !isTooLarge(b) {
			t.Fatalf("ReadPending = %+v, %v", b, err)
		}
		ageEntries(t, c, s, "g", "w1", time.Minute, small, large)
		res, err := limited.Reclaim(ctx, ReclaimArgs{Stream: s, Group: "g", Consumer: "w2", MinIdle: 30 * time.Second})
		if err != nil || !isTooLarge(res.Batch) {
			t.Fatalf("Reclaim = %+v, %v", res, err)
		}
		if b, err = c.ReadPending(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w2"}, ""); err != nil || len(b.Entries) != 2 {
			t.Fatalf("unlimited ReadPending = %+v, %v; want both entries decoded", b, err)
		}

		retryKey := k.Retry("orders", 0, "g")
		now := time.Now()
		err = c.AddRetries(ctx, retryKey,
			Retry{Entry: Entry{ID: small, Payload: []byte(`{"a":1}`)}, Attempts: 1, Due: now},
			Retry{Entry: Entry{ID: large, Payload: []byte(big)}, Attempts: 1, Due: now})
		if err != nil {
			t.Fatal(err)
		}
		due, bad, err := limited.ClaimRetries(ctx, retryKey, now, 10, time.Minute)
		if err != nil || len(due) != 1 || due[0].Entry.ID != small || len(bad) != 1 || bad[0].Entry.ID != large {
			t.Fatalf("ClaimRetries = %+v due, %+v malformed, %v", due, bad, err)
		}
	})
}
