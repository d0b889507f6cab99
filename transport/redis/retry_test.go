package redis

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestRetriesMoveWithTheirAcks schedules failed entries in a retry set in the same step as their
// ack, reads them back when due, and removes them in the commit that handles them: fenced by the
// lease at every step.
func TestRetriesMoveWithTheirAcks(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		retryKey := k.Retry("in", 0, "stage")
		lease, ok, err := c.AcquireLease(ctx, k.Lease("in", 0, "stage"), "owner", time.Minute)
		if err != nil || !ok {
			t.Fatalf("AcquireLease = %v, %v", ok, err)
		}
		b := readN(t, c, in, 4)
		now := time.Now()
		var retries []Retry
		for i, e := range b.Entries[:3] {
			retries = append(retries, Retry{Entry: e, Attempts: 1, FirstFailure: now, LastError: "boom", Due: now.Add(time.Duration(i) * time.Hour)})
		}
		// Entries 0-2 go to the retry set, entry 3 is done: all four acked, in one step.
		_, err = c.Commit(ctx, CommitArgs{Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease, RetryKey: retryKey, Retries: retries})
		if err != nil {
			t.Fatal(err)
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("pending = %d, want 0", n)
		}
		if next, ok, err := c.NextRetry(ctx, retryKey); err != nil || !ok || next.UnixMilli() != now.UnixMilli() {
			t.Fatalf("NextRetry = %v, %v, %v; want %v", next, ok, err, now)
		}
		due, bad, err := c.ClaimRetries(ctx, retryKey, now.Add(time.Minute), 100, time.Minute)
		if err != nil || len(bad) != 0 || len(due) != 1 {
			t.Fatalf("ClaimRetries = %d due, %d malformed, %v; want the one due now", len(due), len(bad), err)
		}
		// Held: nobody else takes it meanwhile.
		if again, _, _ := c.ClaimRetries(ctx, retryKey, now.Add(time.Minute), 100, time.Minute); len(again) != 0 {
			t.Fatalf("a held retry was claimed twice")
		}
		r := due[0]
		if r.Entry.ID != b.Entries[0].ID || string(r.Entry.Payload) != string(b.Entries[0].Payload) ||
			r.Attempts != 1 || r.LastError != "boom" || r.FirstFailure.UnixMilli() != now.UnixMilli() {
			t.Fatalf("retry read back as %+v", r)
		}

		// It fails again: the same commit removes it and schedules attempt 2.
		again := r
		again.Attempts, again.Due = 2, now
		if _, err := c.Commit(ctx, CommitArgs{Stream: in, Group: "stage", Lease: &lease, RetryKey: retryKey,
			RetryDone: []Retry{r}, Retries: []Retry{again}}); err != nil {
			t.Fatal(err)
		}
		due, _, _ = c.ClaimRetries(ctx, retryKey, now.Add(time.Minute), 100, time.Millisecond)
		if len(due) != 1 || due[0].Attempts != 2 {
			t.Fatalf("after rescheduling: %+v", due)
		}

		// A process that lost the lease moves nothing.
		forceExpire(t, c, lease.Key)
		if _, ok, err := c.AcquireLease(ctx, lease.Key, "other", time.Minute); err != nil || !ok {
			t.Fatal(err)
		}
		_, err = c.Commit(ctx, CommitArgs{Stream: in, Group: "stage", Lease: &lease, RetryKey: retryKey, RetryDone: due})
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale commit: %v, want ErrLeaseLost", err)
		}
		if left, _, _ := c.ClaimRetries(ctx, retryKey, now.Add(3*time.Hour), 100, time.Minute); len(left) != 3 {
			t.Fatalf("%d retries left, want 3", len(left))
		}
	})
}

func TestRetryKeyMustShareTheStreamsSlot(t *testing.T) {
	c := serverBackend().open(t)
	k := testKeys(t)
	_, err := c.Commit(ctxT(t), CommitArgs{Stream: k.Stream("a", 0), Group: "g", RetryKey: k.Retry("b", 0, "g"),
		Retries: []Retry{{Entry: Entry{ID: "1-0", Payload: []byte("{}")}}}})
	if err == nil {
		t.Fatal("a retry set in another slot was accepted")
	}
}

func TestMalformedRetryMembersAreReported(t *testing.T) {
	forEach(t, []backend{serverBackend()}, func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := k.Retry("in", 0, "stage")
		if err := c.Universal().ZAdd(ctx, key, zMember(1, "not json")).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.AddRetries(ctx, key, Retry{Entry: Entry{ID: "1-0", Payload: []byte(`{"a":1}`)}, Due: time.UnixMilli(2)}); err != nil {
			t.Fatal(err)
		}
		due, bad, err := c.ClaimRetries(ctx, key, time.Now(), 10, time.Millisecond)
		if err != nil || len(due) != 1 || len(bad) != 1 {
			t.Fatalf("due %d, malformed %d, %v", len(due), len(bad), err)
		}
		// The malformed member can be removed like any other.
		in := k.Stream("in", 0)
		if _, err := c.Commit(ctx, CommitArgs{Stream: in, Group: "stage", RetryKey: key, RetryDone: bad}); err != nil {
			t.Fatal(err)
		}
		if due, bad, _ := c.ClaimRetries(ctx, key, time.Now().Add(time.Second), 10, time.Millisecond); len(due) != 1 || len(bad) != 0 {
			t.Fatalf("after removal: due %d, malformed %d", len(due), len(bad))
		}
	})
}

func zMember(score float64, member string) goredis.Z { return goredis.Z{Score: score, Member: member} }

// A retry keeps what its entry said of its trace context: that its traceparent was invalid and
// dropped (so that its next attempt starts a trace, as the first did), or the context itself.
func TestRetriesKeepTheirTraceContext(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		retryKey := k.Retry("in", 0, "stage")
		b := readN(t, c, in, 2)
		now := time.Now()
		dropped, traced := b.Entries[0], b.Entries[1]
		dropped.TraceDropped = true
		traced.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		traced.TraceState = "vendor=1"
		retries := []Retry{
			{Entry: dropped, Attempts: 1, FirstFailure: now, Due: now},
			{Entry: traced, Attempts: 1, FirstFailure: now, Due: now},
		}
		if _, err := c.Commit(ctx, CommitArgs{Stream: in, Group: "stage", IDs: b.IDs(), RetryKey: retryKey, Retries: retries}); err != nil {
			t.Fatal(err)
		}
		due, bad, err := c.ClaimRetries(ctx, retryKey, now.Add(time.Minute), 100, time.Minute)
		if err != nil || len(bad) != 0 || len(due) != 2 {
			t.Fatalf("ClaimRetries = %d due, %d malformed, %v", len(due), len(bad), err)
		}
		byID := map[string]Entry{}
		for _, r := range due {
			byID[r.Entry.ID] = r.Entry
		}
		if e := byID[dropped.ID]; !e.TraceDropped || e.TraceParent != "" {
			t.Errorf("the retry of an entry whose traceparent was dropped: %+v", e)
		}
		if e := byID[traced.ID]; e.TraceDropped || e.TraceParent != traced.TraceParent || e.TraceState != "vendor=1" {
			t.Errorf("the retry of a traced entry: %+v", e)
		}
	})
}
