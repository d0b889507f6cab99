package redis

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A stateful stage's state and timers are written in the step that acks the batch, fenced by the
// lease with it: a process that lost the partition writes neither acks nor state.
func TestCommitWritesStateWithTheAcks(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		leaseKey := k.Lease("in", 0, "count")
		lease, ok, err := c.AcquireLease(ctx, leaseKey, "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("AcquireLease = %v, %v", ok, err)
		}
		b := readN(t, c, in, 10)
		state := func(set map[string][]byte, del []string, timers map[string]int64, cancel []string) *StateWrites {
			return &StateWrites{Key: k.State("in", 0, "count"), TimersKey: k.Timers("in", 0, "count"),
				Set: set, Delete: del, Timers: timers, Cancel: cancel}
		}
		first := Batch{Entries: b.Entries[:5]}
		_, err = c.Commit(ctx, CommitArgs{Outputs: outputsFor(k, first), Stream: in, Group: "stage", IDs: first.IDs(), Lease: &lease,
			State: state(map[string][]byte{"a": []byte("3"), "b": []byte("2")}, nil, map[string]int64{"close:a": 60_000, "close:b": 70_000}, nil)})
		if err != nil {
			t.Fatal(err)
		}
		if v, found, err := c.ReadState(ctx, k.State("in", 0, "count"), "a"); err != nil || !found || string(v) != "3" {
			t.Fatalf("state of a = %q, %v, %v; want 3", v, found, err)
		}
		// Without outputs too: a batch that only acks and changes state.
		second := Batch{Entries: b.Entries[5:7]}
		_, err = c.Commit(ctx, CommitArgs{Stream: in, Group: "stage", IDs: second.IDs(), Lease: &lease,
			State: state(map[string][]byte{"a": []byte("5")}, []string{"b"}, nil, []string{"close:b"})})
		if err != nil {
			t.Fatal(err)
		}
		if v, _, _ := c.ReadState(ctx, k.State("in", 0, "count"), "a"); string(v) != "5" {
			t.Fatalf("state of a = %q, want 5", v)
		}
		if _, found, _ := c.ReadState(ctx, k.State("in", 0, "count"), "b"); found {
			t.Fatal("the state of b outlived its delete")
		}
		timers, err := c.Universal().ZRangeWithScores(ctx, k.Timers("in", 0, "count"), 0, -1).Result()
		if err != nil || len(timers) != 1 || timers[0].Member != "close:a" || timers[0].Score != 60_000 {
			t.Fatalf("timers = %v, %v; want close:a at 60000 only", timers, err)
		}

		// Another process takes the partition: the old owner's commit writes no state.
		forceExpire(t, c, leaseKey)
		if _, ok, err := c.AcquireLease(ctx, leaseKey, "owner-b", time.Minute); err != nil || !ok {
			t.Fatalf("owner-b: %v, %v", ok, err)
		}
		rest := Batch{Entries: b.Entries[7:]}
		_, err = c.Commit(ctx, CommitArgs{Outputs: outputsFor(k, rest), Stream: in, Group: "stage", IDs: rest.IDs(), Lease: &lease,
			State: state(map[string][]byte{"a": []byte("8")}, nil, map[string]int64{"close:c": 1}, nil)})
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale commit: err = %v, want ErrLeaseLost", err)
		}
		if v, _, _ := c.ReadState(ctx, k.State("in", 0, "count"), "a"); string(v) != "5" {
			t.Fatalf("a fenced-out commit changed the state of a to %q", v)
		}
		if n, _ := c.Universal().ZCard(ctx, k.Timers("in", 0, "count")).Result(); n != 1 {
			t.Fatalf("a fenced-out commit changed the timers: %d, want 1", n)
		}
		if n := pending(t, c, in, "stage"); n != 3 {
			t.Fatalf("pending = %d, want the 3 of the fenced-out commit", n)
		}
	})
}

// ReadStatesOf reads keys of several state hashes, in other slots, in one pipeline: each value in
// its place, nil where its hash holds none.
func TestReadStatesOfSeveralHashes(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		hashes := []string{k.State("t", 0, "tb"), k.State("t", 1, "tb"), k.State("t", 2, "tb")}
		for i, h := range hashes[:2] {
			if err := c.Universal().HSet(ctx, h, "k"+string(rune('0'+i)), "row"+string(rune('0'+i))).Err(); err != nil {
				t.Fatal(err)
			}
		}
		got, err := c.ReadStatesOf(ctx, hashes, [][]string{{"k0", "k1"}, {"k1", "k0"}, {"k2"}})
		if err != nil {
			t.Fatal(err)
		}
		want := [][]string{{"row0", ""}, {"row1", ""}, {""}}
		for i := range want {
			for j, w := range want[i] {
				if string(got[i][j]) != w || (w == "") != (got[i][j] == nil) {
					t.Fatalf("hash %d key %d = %q, want %q (nil for none)", i, j, got[i][j], w)
				}
			}
		}
	})
}

// TestStateOfAnotherTypeAcksNothing: another application's key of another type sits where a
// stateful stage keeps its state. The commit, by the settle script or the effectively-once one,
// fails as WRONGTYPE before it acks anything or writes state, on every backend.
func TestStateOfAnotherTypeAcksNothing(t *testing.T) {
	for _, once := range []bool{false, true} {
		t.Run(fmt.Sprintf("effectively once %v", once), func(t *testing.T) {
			forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
				ctx := ctxT(t)
				in, lease, b := leasedBatch(t, c, k, 6)
				outs := outputsFor(k, b)
				if once {
					outs = onceOutputs(k, b)
				}
				state := stateBatches(k)[0]
				if err := c.Universal().Set(ctx, state.TimersKey, "another application's value", 0).Err(); err != nil {
					t.Fatal(err)
				}
				_, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease, State: state})
				if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !Unrecoverable(err) {
					t.Fatalf("err = %v, want WRONGTYPE", err)
				}
				if p := pending(t, c, in, "stage"); p != int64(b.Len()) {
					t.Fatalf("%d entries pending, want all %d: inputs were acked", p, b.Len())
				}
				if n, err := c.Universal().HLen(ctx, state.Key).Result(); err != nil || n != 0 {
					t.Fatalf("the state hash holds %d, %v: state was written", n, err)
				}
			})
		})
	}
}
