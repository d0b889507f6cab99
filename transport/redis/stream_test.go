package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

func xaddT(t *testing.T, c *Client, stream string, values ...any) string {
	t.Helper()
	id, err := c.Universal().XAdd(ctxT(t), &goredis.XAddArgs{Stream: stream, Values: values}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestReadWithoutGroup(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("r", 0)
		if recs, err := c.Read(ctx, s, "0", 0, 0); err != nil || len(recs) != 0 {
			t.Fatalf("missing stream: %v, %v", recs, err)
		}
		ids := []string{
			xaddT(t, c, s, "payload", `{"n":1}`, "key", "k1", "headers", `{"h":"v"}`),
			xaddT(t, c, s, "payload", `{broken`),
			xaddT(t, c, s, "type", "click", "key", "not-a-key"), // flat
			xaddT(t, c, s, "payload", `{"n":4}`),
		}
		recs, err := c.Read(ctx, s, "0", 0, 0)
		if err != nil || len(recs) != 4 {
			t.Fatalf("read %d records, %v", len(recs), err)
		}
		for i, r := range recs {
			if r.ID != ids[i] {
				t.Fatalf("record %d has ID %s, want %s (stream order)", i, r.ID, ids[i])
			}
		}
		if r := recs[0]; r.Malformed != nil || r.Key != "k1" || string(r.Payload) != `{"n":1}` || r.Headers["h"] != "v" {
			t.Errorf("first: %+v", r)
		}
		if r := recs[1]; r.Malformed == nil || r.Malformed.Reason != "payload is not valid JSON" || r.Malformed.Fields["payload"] != "{broken" || r.Payload != nil {
			t.Errorf("malformed: %+v", r)
		}
		if r := recs[2]; r.Malformed != nil || !r.Flat || string(r.Payload) != `{"key":"not-a-key","type":"click"}` {
			t.Errorf("flat: %+v", r)
		}
		// Paging: count, then after the last ID returned.
		page, err := c.Read(ctx, s, "0", 2, 0)
		if err != nil || len(page) != 2 || page[1].ID != ids[1] {
			t.Fatalf("first page: %+v, %v", page, err)
		}
		page, err = c.Read(ctx, s, page[1].ID, 2, -1)
		if err != nil || len(page) != 2 || page[0].ID != ids[2] || page[1].ID != ids[3] {
			t.Fatalf("second page: %+v, %v", page, err)
		}
		if page, err = c.Read(ctx, s, ids[3], 2, 0); err != nil || len(page) != 0 {
			t.Fatalf("after the last entry: %+v, %v", page, err)
		}
		// Reading left no trace: no consumer group.
		if info, err := c.StreamStats(ctx, s); err != nil || len(info.Groups) != 0 {
			t.Fatalf("groups after Read: %+v, %v", info.Groups, err)
		}
		for _, bad := range []string{"$", ">", "", "x-1"} {
			if _, err := c.Read(ctx, s, bad, 0, 0); err == nil {
				t.Errorf("Read after %q succeeded", bad)
			}
		}
		if _, err := c.Read(ctx, s, "0", DefaultReadCount+1, 0); err == nil {
			t.Error("a count above the maximum was accepted")
		}
		if _, err := c.Read(ctx, "", "0", 0, 0); err == nil {
			t.Error("a read without a stream was accepted")
		}
	})
}

func TestReadWaitsForNewEntries(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("w", 1)
		xaddT(t, c, s, "payload", `{"old":true}`)
		last, err := c.LastID(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			recs []Record
			err  error
		}
		done := make(chan result, 1)
		go func() {
			recs, err := c.Read(ctx, s, last, 0, 20*time.Second)
			done <- result{recs, err}
		}()
		// Whether the XADD comes before or after the read is sent, the read returns it.
		id := xaddT(t, c, s, "payload", `{"new":true}`)
		r := <-done
		if r.err != nil || len(r.recs) != 1 || r.recs[0].ID != id {
			t.Fatalf("blocked read: %+v, %v", r.recs, r.err)
		}
	})
}

func TestCloseEndsABlockedRead(t *testing.T) {
	srv, cl := redistest.Shared(t), redistest.SharedCluster(t, 3)
	for name, tc := range map[string]struct {
		urls  []string
		nodes []*redistest.Server
	}{
		"server":  {[]string{srv.URL()}, []*redistest.Server{srv}},
		"cluster": {cl.URLs(), cl.Nodes()},
	} {
		t.Run(name, func(t *testing.T) {
			c := openURLs(t, tc.urls...)
			s := testKeys(t).Stream("c", 0)
			done := make(chan error, 1)
			go func() {
				_, err := c.Read(ctxT(t), s, "0", 0, time.Minute)
				done <- err
			}()
			// Close once the read is blocked in Redis.
			var admins []*goredis.Client
			for _, n := range tc.nodes {
				admins = append(admins, n.Client(t))
			}
			waitFor(t, "the XREAD to block", func() bool {
				for _, a := range admins {
					list, err := a.ClientList(ctxT(t)).Result()
					if err == nil && strings.Contains(list, "cmd=xread") {
						return true
					}
				}
				return false
			})
			_ = c.Close()
			if err := <-done; err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Read after Close: %v", err)
			}
		})
	}
}

func TestLastIDAndStreamLen(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("l", 2)
		if id, err := c.LastID(ctx, s); err != nil || id != "0-0" {
			t.Fatalf("missing stream: %q, %v", id, err)
		}
		if n, err := c.StreamLen(ctx, s); err != nil || n != 0 {
			t.Fatalf("length of a missing stream: %d, %v", n, err)
		}
		ids := fill(t, c, s, 5)
		if id, err := c.LastID(ctx, s); err != nil || id != ids[4] {
			t.Fatalf("LastID = %q, %v; want %s", id, err, ids[4])
		}
		if n, err := c.StreamLen(ctx, s); err != nil || n != 5 {
			t.Fatalf("StreamLen = %d, %v", n, err)
		}
		if recs, err := c.Read(ctx, s, ids[4], 0, 0); err != nil || len(recs) != 0 {
			t.Fatalf("read after LastID: %+v, %v", recs, err)
		}
		// A key of another type is an error, not an empty stream.
		other := k.Stream("l", 3)
		if err := c.Universal().Set(ctx, other, "x", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StreamLen(ctx, other); err == nil {
			t.Error("StreamLen of a string succeeded")
		}
		if _, err := c.Read(ctx, other, "0", 0, 0); err == nil && !c.isMiniredis(t) { // miniredis reads nothing
			t.Error("Read of a string succeeded")
		}
	})
}

func TestScheduledRetries(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.Retry("t", 4, "enrich")
		if n, err := c.ScheduledRetries(ctx, key); err != nil || n != 0 {
			t.Fatalf("missing set: %d, %v", n, err)
		}
		for i, m := range []string{"a", "b", "c"} {
			if err := c.Universal().ZAdd(ctx, key, goredis.Z{Score: float64(i), Member: m}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := c.ScheduledRetries(ctx, key); err != nil || n != 3 {
			t.Fatalf("ScheduledRetries = %d, %v", n, err)
		}
	})
}
