package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

// Commits fenced by WATCH (watched.go): a change to a watched key between the check and EXEC
// aborts the transaction, and the commit then goes through the settle script, which writes and
// acks the batch whole or reports why it does neither.

// betweenCheckAndExec makes change run before each watched commit's transaction, until the test
// ends.
func betweenCheckAndExec(t *testing.T, change func()) {
	beforeWatchedExec = change
	t.Cleanup(func() { beforeWatchedExec = nil })
}

// leasedBatch reads n entries of a unit's input under a fresh lease.
func leasedBatch(t *testing.T, c *Client, k Keys, n int) (string, Lease, Batch) {
	t.Helper()
	in := k.Stream("in", 0)
	l, ok, err := c.AcquireLease(ctxT(t), k.Lease("in", 0, "stage"), "owner-a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("AcquireLease = %v, %v", ok, err)
	}
	return in, l, readN(t, c, in, n)
}

// TestWatchedCommitWritesOnce: another writer appends to an output stream between every check and
// EXEC, so that each watched try is aborted; the commit is made by the settle script, each output
// written once, every input acked; the next commits to that stream leave it to the script.
func TestWatchedCommitWritesOnce(t *testing.T) {
	forEach(t, singleBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in, lease, b := leasedBatch(t, c, k, 10)
		out := k.Stream("out", 0)
		outs := make([]Output, b.Len())
		for i, e := range b.Entries {
			outs[i] = Output{Stream: out, Entry: Entry{Key: e.Key, Payload: e.Payload}}
		}
		tries := 0
		betweenCheckAndExec(t, func() {
			tries++
			addRaw(t, c, out, "payload", `{"from":"another writer"}`)
		})
		ids, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease})
		if err != nil {
			t.Fatal(err)
		}
		if tries != 2 {
			t.Fatalf("%d watched tries, want 2 (the first again, then the settle script)", tries)
		}
		if n := xlen(t, c, out); n != int64(b.Len())+2 {
			t.Fatalf("%s holds %d entries, want the %d outputs once and the other writer's 2", out, n, b.Len())
		}
		for i, id := range ids {
			msgs, err := c.Universal().XRange(ctx, out, id, id).Result()
			if err != nil || len(msgs) != 1 || msgs[0].Values[FieldPayload] != string(b.Entries[i].Payload) {
				t.Fatalf("output %d (%s): %v, %v", i, id, msgs, err)
			}
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("%d entries pending, want 0", n)
		}
		if !c.watched.busy([]string{out}) {
			t.Fatalf("%s, written by another writer twice, is watched again at once", out)
		}
	})
}

// TestWatchedCommitAbortedAcksNothing: between the check and EXEC, an output stream or the state
// hash is replaced by another type of key, or another owner takes the lease. EXEC runs nothing,
// and the settle script finds what changed and acks nothing: no input is acked without its output
// and its state, nor by a process that lost its lease.
func TestWatchedCommitAbortedAcksNothing(t *testing.T) {
	cases := []struct {
		name   string
		change func(ctx context.Context, c *Client, out string, lease Lease, state *StateWrites) error
		want   func(err error) bool
	}{
		{"output replaced", func(ctx context.Context, c *Client, out string, _ Lease, _ *StateWrites) error {
			return c.Universal().Set(ctx, out, "another application's value", 0).Err()
		}, func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "WRONGTYPE") && Unrecoverable(err)
		}},
		{"lease taken", func(ctx context.Context, c *Client, _ string, lease Lease, _ *StateWrites) error {
			return c.Universal().Set(ctx, lease.Key, "owner-b#99", goredis.KeepTTL).Err()
		}, func(err error) bool { return errors.Is(err, ErrLeaseLost) }},
		{"state replaced", func(ctx context.Context, c *Client, _ string, _ Lease, state *StateWrites) error {
			return c.Universal().Set(ctx, state.Key, "another application's value", 0).Err()
		}, func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "WRONGTYPE") && Unrecoverable(err)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEach(t, singleBackends(), func(t *testing.T, c *Client, k Keys) {
				ctx := ctxT(t)
				in, lease, b := leasedBatch(t, c, k, 6)
				out := k.Stream("out", 0)
				addRaw(t, c, out, "payload", `{"n":-1}`) // a stream when checked
				outs := make([]Output, b.Len())
				for i, e := range b.Entries {
					outs[i] = Output{Stream: out, Entry: Entry{Key: e.Key, Payload: e.Payload}}
				}
				state := stateBatches(k)[0]
				betweenCheckAndExec(t, func() {
					if err := tc.change(ctx, c, out, lease, state); err != nil {
						t.Error(err)
					}
				})
				_, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease, State: state})
				if !tc.want(err) {
					t.Fatalf("err = %v", err)
				}
				if p := pending(t, c, in, "stage"); p != int64(b.Len()) {
					t.Fatalf("%d entries pending, want all %d: inputs were acked", p, b.Len())
				}
				if n, err := c.Universal().ZCard(ctx, state.TimersKey).Result(); err != nil || n != 0 {
					t.Fatalf("the timer set holds %d, %v: state was written", n, err)
				}
			})
		})
	}
}

// TestCommitsAcrossAScriptFlush: the scripts a commit runs are flushed from Redis between batches
// (SCRIPT FLUSH, or a restarted Redis). Every kind of commit still writes its outputs, acks and
// settles whole: retries (the settle script), plain outputs under a lease (WATCH on a single
// server, the settle script on a cluster), effectively-once outputs.
func TestCommitsAcrossAScriptFlush(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in, lease, b := leasedBatch(t, c, k, 30)
		retryKey := k.Retry("in", 0, "stage")
		flush := func() {
			t.Helper()
			var err error
			if cc, ok := c.Universal().(*goredis.ClusterClient); ok {
				err = cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return n.ScriptFlush(ctx).Err() })
			} else {
				err = c.Universal().ScriptFlush(ctx).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		batches := []CommitArgs{
			{Stream: in, Group: "stage", IDs: b.IDs()[:10], Lease: &lease, Outputs: outputsFor(k, Batch{Entries: b.Entries[:5]}),
				RetryKey: retryKey, Retries: []Retry{{Entry: b.Entries[5], Attempts: 1, Due: time.Now().Add(time.Hour)}}},
			{Stream: in, Group: "stage", IDs: b.IDs()[10:20], Lease: &lease, Outputs: outputsFor(k, Batch{Entries: b.Entries[10:20]})},
			{Stream: in, Group: "stage", IDs: b.IDs()[20:], Lease: &lease, Outputs: onceOutputs(k, Batch{Entries: b.Entries[20:]})},
		}
		written := 5
		for i, a := range batches {
			flush()
			if _, err := c.Commit(ctx, a); err != nil {
				t.Fatalf("batch %d: %v", i, err)
			}
			if i > 0 {
				written += len(a.Outputs)
			}
			var total int64
			for p := range 4 {
				total += xlen(t, c, k.Stream("out", p))
			}
			if total != int64(written) {
				t.Fatalf("after batch %d: %d outputs written, want %d", i, total, written)
			}
			if n := pending(t, c, in, "stage"); n != int64(b.Len()-(10*(i+1))) {
				t.Fatalf("after batch %d: %d entries pending, want %d", i, n, b.Len()-10*(i+1))
			}
		}
		if n, err := c.Universal().ZCard(ctx, retryKey).Result(); err != nil || n != 1 {
			t.Fatalf("retry set holds %d, %v; want the 1 retry", n, err)
		}
	})
}

// withoutWatch opens a client as a user that may do anything but WATCH, with a batch of 10 read
// from stream in under lease.
func withoutWatch(t *testing.T) (*redistest.Server, *Client, Keys, string, Lease, Batch) {
	t.Helper()
	srv := redistest.Shared(t)
	user := fmt.Sprintf("nowatch%d", runs.Add(1))
	setUser(t, srv, user, "on", ">pw", "~*", "+@all", "-watch")
	c := openAs(t, srv, user)
	k := testKeys(t)
	in, lease, b := leasedBatch(t, c, k, 10)
	return srv, c, k, in, lease, b
}

// TestCommitWithoutWatch: a Redis user that may not WATCH (an ACL from before commits were fenced
// so) commits through the settle script, whole, and its client stops trying WATCH.
func TestCommitWithoutWatch(t *testing.T) {
	_, c, k, in, lease, b := withoutWatch(t)
	ctx := ctxT(t)
	if _, err := c.Commit(ctx, CommitArgs{Outputs: outputsFor(k, b), Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease}); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, c, in, "stage"); n != 0 {
		t.Fatalf("%d entries pending, want 0", n)
	}
	var total int64
	for p := range 4 {
		total += xlen(t, c, k.Stream("out", p))
	}
	if total != int64(b.Len()) {
		t.Fatalf("%d outputs written, want %d", total, b.Len())
	}
	if !c.watched.busy(nil) {
		t.Fatal("the client still tries WATCH, which its user may not send")
	}
}

// TestTheAccessCheckFindsWatchRefused: the start-up check of a user that may not WATCH passes (the
// command is optional), and the client then commits without sending it, so the server's ACL log
// records no refusal.
func TestTheAccessCheckFindsWatchRefused(t *testing.T) {
	srv, c, k, in, lease, b := withoutWatch(t)
	ctx := ctxT(t)
	outs := outputsFor(k, b)
	a := NewAccess(k)
	var streams []string
	for _, o := range outs {
		if !slices.Contains(streams, o.Stream) {
			streams = append(streams, o.Stream)
		}
	}
	a.Settle("stage s", in, "stage", "", lease.Key, StateKeys{}, nil, streams)
	if err := c.CheckAccess(ctx, a.Checks()); err != nil {
		t.Fatalf("the check refused a user without WATCH: %v", err)
	}
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease}); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, c, in, "stage"); n != 0 {
		t.Fatalf("%d entries pending, want 0", n)
	}
	if log, err := admin.Do(ctx, "ACL", "LOG").Slice(); err != nil || len(log) > 0 {
		t.Fatalf("the server refused commands of the commit: %v %v", log, err)
	}
}

// stateOf is a stateful stage's state on a partition, as Redis holds it: the hash's fields, then
// the timers and the holds with their times.
func stateOf(t *testing.T, c *Client, s *StateWrites) []string {
	t.Helper()
	ctx := ctxT(t)
	hash, err := c.Universal().HGetAll(ctx, s.Key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k, v := range hash {
		out = append(out, "hash "+k+"="+v)
	}
	for name, key := range map[string]string{"timer": s.TimersKey, "hold": s.HoldsKey} {
		zs, err := c.Universal().ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range zs {
			out = append(out, fmt.Sprintf("%s %v=%v", name, z.Member, z.Score))
		}
	}
	slices.Sort(out)
	return out
}

// stateBatches are two batches' state writes on the state keys of k: every kind of write, a key
// set then deleted, a timer set then cancelled, a hold set then released.
func stateBatches(k Keys) [2]*StateWrites {
	keys := func(s *StateWrites) *StateWrites {
		s.Key, s.TimersKey, s.HoldsKey = k.State("in", 0, "st"), k.Timers("in", 0, "st"), k.Holds("in", 0, "st")
		return s
	}
	return [2]*StateWrites{
		keys(&StateWrites{Set: map[string][]byte{"a": []byte("1"), "b": []byte("2"), "c": []byte{0, 255}},
			Timers: map[string]int64{"close:a": 30, "close:b": 10, "close:c": 20}, Holds: map[string]int64{"h1": 5, "h2": 7}}),
		keys(&StateWrites{Set: map[string][]byte{"a": []byte("3")}, Delete: []string{"b"}, Timers: map[string]int64{"close:d": 40},
			Cancel: []string{"close:b"}, Holds: map[string]int64{"h3": 9}, Release: []string{"h1"}}),
	}
}

// TestWatchedCommitWritesStateAsTheScript: a stateful stage's commits under a lease on a single
// server are watched, and leave the state, the timers and the holds as the settle script leaves
// them.
func TestWatchedCommitWritesStateAsTheScript(t *testing.T) {
	forEach(t, singleBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		watched := c.watched
		var want []string
		for _, run := range []struct {
			keys    Keys
			watched bool
		}{{testKeys(t), false}, {k, true}} {
			c.watched = nil // as on a cluster: every commit goes through the script
			if run.watched {
				c.watched = watched
			}
			tries := 0
			betweenCheckAndExec(t, func() { tries++ })
			in, lease, b := leasedBatch(t, c, run.keys, 4)
			states := stateBatches(run.keys)
			for i, s := range states {
				part := Batch{Entries: b.Entries[2*i : 2*i+2]}
				if _, err := c.Commit(ctx, CommitArgs{Outputs: outputsFor(run.keys, part), Stream: in, Group: "stage", IDs: part.IDs(),
					Lease: &lease, State: s}); err != nil {
					t.Fatal(err)
				}
			}
			if n := pending(t, c, in, "stage"); n != 0 {
				t.Fatalf("%d entries pending, want 0", n)
			}
			got := stateOf(t, c, states[0])
			if !run.watched {
				want = got
				continue
			}
			if tries != 2 {
				t.Fatalf("%d watched commits, want both", tries)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("watched commits left\n%v\nthe settle script\n%v", got, want)
			}
		}
	})
}
