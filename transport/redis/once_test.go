package redis

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// singleBackends are a real server and miniredis: the backends on which an effectively-once commit
// under a lease is one script without markers.
func singleBackends() []backend { return []backend{serverBackend(), miniredisBackend()} }

// onceOutputs maps every entry of b to an effectively-once output in one of 4 partitions of topic
// out, with its marker key.
func onceOutputs(k Keys, b Batch) []Output {
	outs := outputsFor(k, b)
	for i, e := range b.Entries {
		outs[i].DedupKey = k.Dedup("out", Partition(e.Key, 4), "stage", "in", 0, e.ID, 0)
	}
	return outs
}

// outputsIn returns the payloads written to the 4 partitions of topic out, in stream order.
func outputsIn(t *testing.T, c *Client, k Keys) []string {
	t.Helper()
	var got []string
	for p := range 4 {
		msgs, err := c.Universal().XRange(ctxT(t), k.Stream("out", p), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			got = append(got, fmt.Sprint(m.Values["payload"]))
		}
	}
	return got
}

// markersIn counts the marker keys of outs that exist.
func markersIn(t *testing.T, c *Client, outs []Output) int {
	t.Helper()
	n := 0
	for _, o := range outs {
		found, err := c.Universal().Exists(ctxT(t), o.DedupKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += int(found)
	}
	return n
}

// TestCommitOnceWithoutMarkers: on a single server, an effectively-once commit under a lease writes
// its outputs and acks its inputs with no marker key; on a cluster, where its outputs live on other
// nodes than its acks, every output has its marker.
func TestCommitOnceWithoutMarkers(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		lease, ok, err := c.AcquireLease(ctx, k.Lease("in", 0, "stage"), "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		b := readN(t, c, in, 12)
		outs := onceOutputs(k, b)
		ids, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease})
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if id == "" {
				t.Fatalf("output %d has no ID: %v", i, ids)
			}
		}
		if got := outputsIn(t, c, k); len(got) != 12 {
			t.Fatalf("%d outputs, want 12: %v", len(got), got)
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("pending = %d, want 0", n)
		}
		want := 0
		if c.IsCluster() {
			want = len(outs)
		}
		if n := markersIn(t, c, outs); n != want {
			t.Fatalf("%d markers after the commit, want %d", n, want)
		}
	})
}

// TestCommitOnceLeaseLostWritesNothing: a process that lost its lease writes none of its
// effectively-once outputs (at-least-once writes them and only the acks are refused), so the next
// owner, which processes the batch again, writes each once.
func TestCommitOnceLeaseLostWritesNothing(t *testing.T) {
	forEach(t, singleBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		leaseKey := k.Lease("in", 0, "stage")
		lease, ok, err := c.AcquireLease(ctx, leaseKey, "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		b := readN(t, c, in, 12)
		forceExpire(t, c, leaseKey)
		lb, ok, err := c.AcquireLease(ctx, leaseKey, "owner-b", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		outs := onceOutputs(k, b)
		_, err = c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease})
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("commit without the lease: err = %v, want ErrLeaseLost", err)
		}
		if got := outputsIn(t, c, k); len(got) != 0 {
			t.Fatalf("the commit without the lease wrote %d outputs, want none", len(got))
		}
		if n := pending(t, c, in, "stage"); n != 12 {
			t.Fatalf("pending = %d, want 12", n)
		}
		if _, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lb}); err != nil {
			t.Fatal(err)
		}
		if got := outputsIn(t, c, k); len(got) != 12 {
			t.Fatalf("%d outputs after the new owner's commit, want 12", len(got))
		}
	})
}

// TestCommitOnceSentTwiceWritesOnce: the same commit sent again (a client that retries after the
// reply was lost) finds that it was made and writes nothing.
func TestCommitOnceSentTwiceWritesOnce(t *testing.T) {
	forEach(t, singleBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		leaseKey := k.Lease("in", 0, "stage")
		lease, ok, err := c.AcquireLease(ctx, leaseKey, "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		b := readN(t, c, in, 12)
		args := CommitArgs{Outputs: onceOutputs(k, b), Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease,
			DedupTTL: time.Minute, commitID: "commit-1"}
		for range 2 {
			if _, err := c.Commit(ctx, args); err != nil {
				t.Fatal(err)
			}
		}
		if got := outputsIn(t, c, k); len(got) != 12 {
			t.Fatalf("%d outputs after the commit was sent twice, want 12", len(got))
		}
		ttl, err := c.Universal().PTTL(ctx, LeaseCommit(leaseKey)).Result()
		if err != nil || ttl <= 0 || ttl > time.Minute {
			t.Fatalf("commit record ttl = %v, %v; want at most the DedupTTL", ttl, err)
		}
		// Another commit (another ID) of the same unit is made.
		addRaw(t, c, in, "payload", `{"n":99}`, "key", "k99")
		more, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w1", Block: -1})
		if err != nil || more.Len() != 1 {
			t.Fatalf("read %d entries, %v; want the one added", more.Len(), err)
		}
		next := CommitArgs{Outputs: onceOutputs(k, b)[:1], Stream: in, Group: "stage", IDs: more.IDs(), Lease: &lease,
			commitID: "commit-2"}
		if _, err := c.Commit(ctx, next); err != nil {
			t.Fatal(err)
		}
		if got := outputsIn(t, c, k); len(got) != 13 {
			t.Fatalf("%d outputs after another commit, want 13", len(got))
		}
	})
}

// TestCommitOnceWrongTypeWritesNothing: an output key of another type (WRONGTYPE) refuses the whole
// commit before anything is written: the outputs to the other streams are not written, and nothing
// is acked, so that the batch, processed again once the key is fixed, is written once.
func TestCommitOnceWrongTypeWritesNothing(t *testing.T) {
	forEach(t, singleBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		lease, ok, err := c.AcquireLease(ctx, k.Lease("in", 0, "stage"), "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		b := readN(t, c, in, 12)
		outs := onceOutputs(k, b)
		bad := outs[len(outs)-1].Stream
		if err := c.Universal().Set(ctx, bad, "not a stream", 0).Err(); err != nil {
			t.Fatal(err)
		}
		args := CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease}
		_, err = c.Commit(ctx, args)
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !Unrecoverable(err) {
			t.Fatalf("commit into a key of another type: err = %v, want an unrecoverable WRONGTYPE", err)
		}
		if err := c.Universal().Del(ctx, bad).Err(); err != nil {
			t.Fatal(err)
		}
		if got := outputsIn(t, c, k); len(got) != 0 {
			t.Fatalf("the refused commit wrote %d outputs, want none", len(got))
		}
		if n := pending(t, c, in, "stage"); n != 12 {
			t.Fatalf("pending = %d after the refused commit, want 12", n)
		}
		if _, err := c.Commit(ctx, args); err != nil {
			t.Fatal(err)
		}
		if got := outputsIn(t, c, k); len(got) != 12 {
			t.Fatalf("%d outputs, want 12", len(got))
		}
	})
}

// TestCommitOnceSettlesRetriesAndState: the commit without markers moves retries and writes state
// with its outputs and acks, and a commit without the lease does none of it: the retry it took
// stays in the retry set, to be taken again, and its outputs are not written.
func TestCommitOnceSettlesRetriesAndState(t *testing.T) {
	forEach(t, singleBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		leaseKey, retryKey := k.Lease("in", 0, "stage"), k.Retry("in", 0, "stage")
		stateKey, timersKey := k.State("in", 0, "stage"), k.Timers("in", 0, "stage")
		lease, ok, err := c.AcquireLease(ctx, leaseKey, "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		b := readN(t, c, in, 4)
		now := time.Now()
		outs := onceOutputs(k, b)
		retries := []Retry{
			{Entry: b.Entries[0], Attempts: 1, FirstFailure: now, LastError: "boom", Due: now},
			{Entry: b.Entries[1], Attempts: 1, FirstFailure: now, LastError: "boom", Due: now.Add(time.Hour)},
		}
		state := &StateWrites{Key: stateKey, Set: map[string][]byte{"k": []byte("v")}, TimersKey: timersKey,
			Timers: map[string]int64{"t": 42}}
		if _, err := c.Commit(ctx, CommitArgs{Outputs: outs[2:], Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease,
			RetryKey: retryKey, Retries: retries, State: state}); err != nil {
			t.Fatal(err)
		}
		zcard := func(key string) int64 {
			n, err := c.Universal().ZCard(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("pending = %d, want 0", n)
		}
		if got := outputsIn(t, c, k); len(got) != 2 {
			t.Fatalf("%d outputs, want 2", len(got))
		}
		if v, found, err := c.ReadState(ctx, stateKey, "k"); err != nil || !found || string(v) != "v" {
			t.Fatalf("state k = %q, %v, %v; want v", v, found, err)
		}
		if n := zcard(retryKey); n != 2 {
			t.Fatalf("%d retries scheduled, want 2", n)
		}
		if n := zcard(timersKey); n != 1 {
			t.Fatalf("%d timers, want 1", n)
		}
		due, _, err := c.ClaimRetries(ctx, retryKey, now.Add(time.Minute), 10, time.Millisecond)
		if err != nil || len(due) != 1 {
			t.Fatalf("ClaimRetries = %d due, %v; want 1", len(due), err)
		}
		retried := onceOutputs(k, b)[:1]

		// The lease is lost before the retry's commit: nothing of it happens.
		forceExpire(t, c, leaseKey)
		lb, ok, err := c.AcquireLease(ctx, leaseKey, "owner-b", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		_, err = c.Commit(ctx, CommitArgs{Outputs: retried, Stream: in, Group: "stage", Lease: &lease, RetryKey: retryKey, RetryDone: due})
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("retry commit without the lease: err = %v, want ErrLeaseLost", err)
		}
		if got := outputsIn(t, c, k); len(got) != 2 {
			t.Fatalf("%d outputs after a commit without the lease, want 2", len(got))
		}
		if n := zcard(retryKey); n != 2 {
			t.Fatalf("%d retries after a commit without the lease, want the 2 (the retry stays to be taken again)", n)
		}
		// The new owner takes the retry again and commits it: written once, and gone from the set.
		again, _, err := c.ClaimRetries(ctx, retryKey, now.Add(2*time.Minute), 10, time.Millisecond) // past the first hold
		if err != nil || len(again) != 1 {
			t.Fatalf("ClaimRetries = %d due, %v; want the retry again", len(again), err)
		}
		if _, err := c.Commit(ctx, CommitArgs{Outputs: retried, Stream: in, Group: "stage", Lease: &lb, RetryKey: retryKey, RetryDone: again}); err != nil {
			t.Fatal(err)
		}
		if got := outputsIn(t, c, k); len(got) != 3 {
			t.Fatalf("%d outputs after the retry, want 3", len(got))
		}
		if n := zcard(retryKey); n != 1 {
			t.Fatalf("%d retries after the retry's commit, want 1", n)
		}
	})
}
