package redis

import (
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

// Commits whose writes fail inside the transaction that acks: what is acknowledged, and what the
// error says.

// TestCommitWrongTypeOutput: an output's stream name holds another type of key (another
// application's), so its XADD fails with WRONGTYPE. On a single server it fails inside the EXEC
// that also acks, and the ack, which checks that the outputs' keys are streams, acks nothing; on a
// cluster, where the outputs are written first and acked only once written, nothing is acked
// either. The error, unrecoverable, names the key.
func TestCommitWrongTypeOutput(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in, out := k.Stream("in", 0), k.Stream("out", 0)
		b := readN(t, c, in, 3)
		if err := c.Universal().Set(ctx, out, "another application's value", 0).Err(); err != nil {
			t.Fatal(err)
		}
		outs := make([]Output, b.Len())
		for i, e := range b.Entries {
			outs[i] = Output{Stream: out, Entry: Entry{Key: e.Key, Payload: e.Payload}}
		}
		_, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs()})
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), out) || !Unrecoverable(err) {
			t.Fatalf("commit to a key of another type: err = %v, want an unrecoverable WRONGTYPE naming %s", err, out)
		}
		if strings.Contains(err.Error(), "the inputs were acked") {
			t.Errorf("err = %v: the inputs were acked without their outputs", err)
		}
		if p := pending(t, c, in, "stage"); p != int64(b.Len()) {
			t.Errorf("%d entries pending, want all %d: inputs were acked without their outputs", p, b.Len())
		}
	})
}

// TestCommitDedupScriptFailingAcksNothing: the effectively-once script fails halfway through a
// batch (a marker's key holds another type of key: WRONGTYPE). Scripts do not roll back, so the
// outputs before it are written; the inputs must not be acked. Once the key is gone, the same
// commit writes the rest of the outputs, each once, and acks.
func TestCommitDedupScriptFailingAcksNothing(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in, out := k.Stream("in", 0), k.Stream("out", 0)
		b := readN(t, c, in, 10)
		outs := make([]Output, b.Len())
		for i, e := range b.Entries {
			outs[i] = Output{Stream: out, Entry: Entry{Key: e.Key, Payload: e.Payload}, DedupKey: k.Dedup("out", 0, "stage", "in", 0, e.ID, 0)}
		}
		bad := outs[5].DedupKey
		if err := c.Universal().HSet(ctx, bad, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		args := CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs()}
		_, err := c.Commit(ctx, args)
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || strings.Contains(err.Error(), "were acked") {
			t.Fatalf("commit with a failing effectively-once script: err = %v, want WRONGTYPE, nothing acked", err)
		}
		if p := pending(t, c, in, "stage"); p != int64(b.Len()) {
			t.Fatalf("%d of %d entries pending after the effectively-once script failed: the others were acked without their outputs", p, b.Len())
		}
		if n := xlen(t, c, out); n != 5 {
			t.Errorf("%d outputs written before the failure, want 5", n)
		}
		if err := c.Universal().Del(ctx, bad).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Commit(ctx, args); err != nil {
			t.Fatal(err)
		}
		if n := xlen(t, c, out); n != int64(b.Len()) {
			t.Errorf("%d outputs after the commit was made again, want %d, each once", n, b.Len())
		}
		if p := pending(t, c, in, "stage"); p != 0 {
			t.Errorf("%d entries pending", p)
		}
	})
}

// TestCheckpointOfAFailingDedupScript: an effectively-once source's batch, whose script fails
// halfway (WRONGTYPE at a marker), must not move the source's checkpoint, fenced by its lease or
// not: the source would resume after lines whose entries were never written. Once the key is
// gone, the same commit writes the rest, each once, and records the checkpoint.
func TestCheckpointOfAFailingDedupScript(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		leaseKey, posKey, out := k.SourceLease("file"), k.SourcePosition("file"), k.Stream("out", 0)
		lease, ok, err := c.AcquireLease(ctx, leaseKey, "owner", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		for _, fenced := range []bool{true, false} {
			var outs []Output
			for i := range 10 {
				outs = append(outs, Output{Stream: out, Entry: Entry{Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))},
					DedupKey: k.Dedup("out", 0, "file", "file", 0, fmt.Sprintf("%v:%d", fenced, i), 0)})
			}
			args := CommitArgs{Outputs: outs, Checkpoint: &Checkpoint{Key: posKey, Value: fmt.Sprint("fenced ", fenced)}}
			if fenced {
				args.Lease = &lease
			}
			before := xlen(t, c, out)
			bad := outs[5].DedupKey
			if err := c.Universal().HSet(ctx, bad, "f", "v").Err(); err != nil {
				t.Fatal(err)
			}
			_, err := c.Commit(ctx, args)
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || strings.Contains(err.Error(), "checkpoint was recorded") {
				t.Fatalf("fenced %v: err = %v, want WRONGTYPE, no checkpoint", fenced, err)
			}
			if v, _, _ := c.ReadCheckpoint(ctx, posKey); v == args.Checkpoint.Value {
				t.Fatalf("fenced %v: the checkpoint moved past outputs that were not written", fenced)
			}
			if err := c.Universal().Del(ctx, bad).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Commit(ctx, args); err != nil {
				t.Fatal(err)
			}
			if v, _, _ := c.ReadCheckpoint(ctx, posKey); v != args.Checkpoint.Value {
				t.Errorf("fenced %v: checkpoint %q after the commit worked", fenced, v)
			}
			if n := xlen(t, c, out) - before; n != 10 {
				t.Errorf("fenced %v: %d outputs, want 10, each once", fenced, n)
			}
		}
	})
}

// TestCommitRefusedInAScriptWritesNothing: the user's permission to run a command of the settle
// or the effectively-once script is taken away while a run goes on (ACL SETUSER). Lua undoes
// nothing, so each script checks its commands, on their keys, before its first write: the commit
// writes nothing and acks nothing, and its error, unrecoverable, names the command. Settling, an
// XACK followed by a refused ZADD would have acked inputs whose retries were never scheduled
// (lost); effectively once, XADDs followed by a refused XACK would have left outputs that the
// inputs, processed again, write again.
func TestCommitRefusedInAScriptWritesNothing(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name, revoke, command string
		once                  bool
	}{
		{"settle, its retries refused", "-zadd", "ZADD", false},
		{"effectively once, its ack refused", "-xack", "XACK", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			user := fmt.Sprintf("revoked%d", runs.Add(1))
			setUser(t, srv, user, "on", ">pw", "~*", "+@all")
			c := openAs(t, srv, user)
			k := testKeys(t)
			in, lease, b := leasedBatch(t, c, k, 4)
			out, retryKey := k.Stream("out", 0), k.Retry("in", 0, "stage")
			now := time.Now()
			args := CommitArgs{Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease, RetryKey: retryKey,
				Retries: []Retry{{Entry: b.Entries[0], Attempts: 1, FirstFailure: now, Due: now}}}
			if tc.once {
				for _, e := range b.Entries[1:] {
					args.Outputs = append(args.Outputs, Output{Stream: out, Entry: Entry{Key: e.Key, Payload: e.Payload},
						DedupKey: k.Dedup("out", 0, "stage", "in", 0, e.ID, 0)})
				}
			}
			setUser(t, srv, user, tc.revoke)
			_, err := c.Commit(ctx, args)
			if err == nil || !Unrecoverable(err) || !strings.Contains(err.Error(), tc.command) {
				t.Fatalf("commit without %s: err = %v, want an unrecoverable error naming it", tc.command, err)
			}
			if p := pending(t, c, in, "stage"); p != int64(b.Len()) {
				t.Errorf("%d entries pending, want all %d: the commit acked some", p, b.Len())
			}
			if n := xlen(t, c, out); n != 0 {
				t.Errorf("%d outputs written by a commit that acked nothing", n)
			}
			if n, err := c.Universal().Exists(ctx, retryKey).Result(); err != nil || n != 0 {
				t.Errorf("the retry set exists (%d, %v): the commit scheduled retries", n, err)
			}
		})
	}
}

// TestOffloadRefusedInAScriptWritesNothing: a commit whose output's payload is offloaded, by a
// user who may no longer SET (the payload's key), writes no entry without its payload: the script
// checks its writes before the XADD, and the inputs stay pending.
func TestOffloadRefusedInAScriptWritesNothing(t *testing.T) {
	srv := redistest.Start(t)
	ctx := ctxT(t)
	user := fmt.Sprintf("revoked%d", runs.Add(1))
	setUser(t, srv, user, "on", ">pw", "~*", "+@all")
	c := openAs(t, srv, user).WithOffloadOver(1 << 10)
	k := testKeys(t)
	in, lease, b := leasedBatch(t, c, k, 2)
	out := k.Stream("out", 0)
	// The stream exists: the settle's check that each output stream is a stream passes.
	if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: out, Values: []any{"payload", "{}"}}).Err(); err != nil {
		t.Fatal(err)
	}
	large := []byte(`{"pad":"` + strings.Repeat("x", 4<<10) + `"}`)
	args := CommitArgs{Stream: in, Group: "stage", IDs: b.IDs(), Lease: &lease,
		Outputs: []Output{{Stream: out, Entry: Entry{Key: "k", Payload: large}}}}
	setUser(t, srv, user, "-set")
	_, err := c.Commit(ctx, args)
	if err == nil || !Unrecoverable(err) || !strings.Contains(err.Error(), "SET") {
		t.Errorf("commit without SET: err = %v, want an unrecoverable error naming it", err)
	}
	if n := xlen(t, c, out); n != 1 {
		t.Errorf("%d entries written without their payload", n-1)
	}
	if p := pending(t, c, in, "stage"); p != int64(b.Len()) {
		t.Errorf("%d entries pending, want all %d: the commit acked some", p, b.Len())
	}
}
