package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

// readN sets up a group on stream with n entries and reads them all as consumer w1.
func readN(t *testing.T, c *Client, stream string, n int) Batch {
	t.Helper()
	ctx := ctxT(t)
	if err := c.EnsureGroup(ctx, stream, "stage"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		addRaw(t, c, stream, "payload", fmt.Sprintf(`{"n":%d}`, i), "key", fmt.Sprintf("k%d", i))
	}
	b, err := c.ReadGroup(ctx, ReadArgs{Stream: stream, Group: "stage", Consumer: "w1", Block: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Entries) != n {
		t.Fatalf("read %d entries, want %d", len(b.Entries), n)
	}
	return b
}

func pending(t *testing.T, c *Client, stream, group string) int64 {
	t.Helper()
	p, err := c.Universal().XPending(ctxT(t), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

func xlen(t *testing.T, c *Client, stream string) int64 {
	t.Helper()
	n, err := c.Universal().XLen(ctxT(t), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// outputsFor maps every input entry to an output in one of 4 partitions of topic out.
func outputsFor(k Keys, b Batch) []Output {
	var outs []Output
	for _, e := range b.Entries {
		outs = append(outs, Output{Stream: k.Stream("out", Partition(e.Key, 4)), Entry: Entry{Key: e.Key, Payload: e.Payload, TraceParent: validTP}})
	}
	return outs
}

func TestCommitWritesOutputsAndAcks(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		b := readN(t, c, in, 20)
		outs := outputsFor(k, b)
		ids, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs()})
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != len(outs) {
			t.Fatalf("%d output IDs for %d outputs", len(ids), len(outs))
		}
		for i, o := range outs {
			msgs, err := c.Universal().XRange(ctx, o.Stream, ids[i], ids[i]).Result()
			if err != nil || len(msgs) != 1 {
				t.Fatalf("output %d (%s %s): %v, %v", i, o.Stream, ids[i], msgs, err)
			}
			e, err := DecodeEntry(msgs[0])
			if err != nil || e.Key != o.Entry.Key || string(e.Payload) != string(o.Entry.Payload) || e.TraceParent != validTP {
				t.Fatalf("output %d = %+v, %v", i, e, err)
			}
		}
		var total int64
		for p := range 4 {
			total += xlen(t, c, k.Stream("out", p))
		}
		if total != 20 {
			t.Fatalf("%d outputs written, want 20", total)
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("PEL has %d entries after commit, want 0", n)
		}
	})
}

func TestCommitFencedByLease(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		leaseKey := k.Lease("in", 0, "stage")
		lease, ok, err := c.AcquireLease(ctx, leaseKey, "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("AcquireLease = %v, %v", ok, err)
		}
		b := readN(t, c, in, 10)
		// Scripts not cached (Redis restarted, SCRIPT FLUSH): the commit still works.
		_ = c.Universal().ScriptFlush(ctx).Err()
		first := Batch{Entries: b.Entries[:5]}
		if _, err := c.Commit(ctx, CommitArgs{Outputs: outputsFor(k, first), Stream: in, Group: "stage", IDs: first.IDs(), Lease: &lease}); err != nil {
			t.Fatal(err)
		}
		if n := pending(t, c, in, "stage"); n != 5 {
			t.Fatalf("pending = %d, want 5", n)
		}
		// The lease expires and owner-b takes it.
		forceExpire(t, c, leaseKey)
		lb, ok, err := c.AcquireLease(ctx, leaseKey, "owner-b", time.Minute)
		if err != nil || !ok || lb.Token <= lease.Token {
			t.Fatalf("owner-b: %+v, %v, %v", lb, ok, err)
		}
		rest := Batch{Entries: b.Entries[5:]}
		_, err = c.Commit(ctx, CommitArgs{Outputs: outputsFor(k, rest), Stream: in, Group: "stage", IDs: rest.IDs(), Lease: &lease})
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale commit: err = %v, want ErrLeaseLost", err)
		}
		if err := c.Ack(ctx, in, "stage", &lease, rest.IDs()...); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale Ack: err = %v, want ErrLeaseLost", err)
		}
		if n := pending(t, c, in, "stage"); n != 5 {
			t.Fatalf("pending = %d after a fenced-out commit, want 5 (nothing acked)", n)
		}
		// The new owner acks.
		if err := c.Ack(ctx, in, "stage", &lb, rest.IDs()...); err != nil {
			t.Fatal(err)
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("pending = %d, want 0", n)
		}
	})
}

// forceExpire makes a key expire now (PEXPIRE 1) and waits until Redis has removed it.
func forceExpire(t *testing.T, c *Client, key string) {
	t.Helper()
	ctx := ctxT(t)
	if err := c.Universal().PExpire(ctx, key, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, key+" to expire", func() bool {
		n, err := c.Universal().Exists(ctx, key).Result()
		return err == nil && n == 0
	})
}

func TestFencedAckOfManyIDs(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		fill(t, c, in, 9000) // more than Lua's unpack limit (8000) in one call
		if err := c.EnsureGroup(ctx, in, "stage"); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for len(ids) < 9000 {
			b, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w", Block: -1})
			if err != nil || b.Len() == 0 {
				t.Fatal(b.Len(), err)
			}
			ids = append(ids, b.IDs()...)
		}
		l, _, err := c.AcquireLease(ctx, k.Lease("in", 0, "stage"), "w", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Ack(ctx, in, "stage", &l, ids...); err != nil {
			t.Fatal(err)
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("pending = %d", n)
		}
	})
}

func TestCommitRejectsLeaseInAnotherSlot(t *testing.T) {
	c := miniredisBackend().open(t)
	k := testKeys(t)
	l := Lease{Key: k.Lease("other", 1, "stage"), Owner: "o", Token: 1}
	_, err := c.Commit(ctxT(t), CommitArgs{Stream: k.Stream("in", 0), Group: "stage", IDs: []string{"1-0"}, Lease: &l})
	if err == nil || !strings.Contains(err.Error(), "hash slot") {
		t.Fatalf("err = %v", err)
	}
	_, err = c.Commit(ctxT(t), CommitArgs{Outputs: []Output{{Stream: "s", Entry: Entry{}}}})
	if err == nil {
		t.Fatal("empty output payload accepted")
	}
}

// TestCommitOutOfMemoryAcksNothing fills Redis's memory limit: the XADDs are refused, and the
// ack must not happen without them.
func TestCommitOutOfMemoryAcksNothing(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		c := openURLs(t, srv.URL())
		k := testKeys(t)
		in := k.Stream("in", 0)
		b := readN(t, c, in, 10)
		setMaxMemory(t, srv.Client(t), "1")
		commitRefused(t, c, k, in, b)
		setMaxMemory(t, srv.Client(t), "0")
		commitWorks(t, c, k, in, b)
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.SharedCluster(t, 3)
		c := openURLs(t, cl.URLs()...)
		k := testKeys(t)
		in := k.Stream("in", 0)
		b := readN(t, c, in, 10)
		// Fill the memory of one node that holds an output partition but not the input.
		cc := c.Universal().(*goredis.ClusterClient)
		ctx := ctxT(t)
		inNode, err := cc.MasterForKey(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		var full *goredis.Client
		for p := range 4 {
			n, err := cc.MasterForKey(ctx, k.Stream("out", p))
			if err != nil {
				t.Fatal(err)
			}
			if n.Options().Addr != inNode.Options().Addr {
				full = n
				break
			}
		}
		if full == nil {
			t.Skip("every output partition is on the input's node")
		}
		setMaxMemory(t, full, "1")
		t.Cleanup(func() { setMaxMemory(t, full, "0") })
		commitRefused(t, c, k, in, b)
		setMaxMemory(t, full, "0")
		commitWorks(t, c, k, in, b)
	})
}

func setMaxMemory(t *testing.T, r *goredis.Client, v string) {
	t.Helper()
	if err := r.ConfigSet(ctxT(t), "maxmemory", v).Err(); err != nil {
		t.Fatal(err)
	}
}

func commitRefused(t *testing.T, c *Client, k Keys, in string, b Batch) {
	t.Helper()
	_, err := c.Commit(ctxT(t), CommitArgs{Outputs: outputsFor(k, b), Stream: in, Group: "stage", IDs: b.IDs()})
	if err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("commit over the memory limit: err = %v, want OOM", err)
	}
	if n := pending(t, c, in, "stage"); n != int64(b.Len()) {
		t.Fatalf("pending = %d after a refused commit, want %d: inputs were acked without their outputs", n, b.Len())
	}
}

func commitWorks(t *testing.T, c *Client, k Keys, in string, b Batch) {
	t.Helper()
	if _, err := c.Commit(ctxT(t), CommitArgs{Outputs: outputsFor(k, b), Stream: in, Group: "stage", IDs: b.IDs()}); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, c, in, "stage"); n != 0 {
		t.Fatalf("pending = %d, want 0", n)
	}
}

func TestCommitEffectivelyOnce(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		in := k.Stream("in", 0)
		b := readN(t, c, in, 12)
		outs := outputsFor(k, b)
		for i, e := range b.Entries {
			p := Partition(e.Key, 4)
			outs[i].DedupKey = k.Dedup("out", p, "stage", "in", 0, e.ID, 0)
		}
		// The first commit writes the outputs but "crashes" before the ack (no IDs).
		first, err := c.Commit(ctx, CommitArgs{Outputs: outs, DedupTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// The re-processed batch commits again, with the ack: no duplicates.
		second, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: b.IDs(), DedupTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(first) != fmt.Sprint(second) {
			t.Fatalf("second commit returned other IDs:\n%v\n%v", first, second)
		}
		var total int64
		for p := range 4 {
			total += xlen(t, c, k.Stream("out", p))
		}
		if total != 12 {
			t.Fatalf("%d outputs, want 12 (no duplicates)", total)
		}
		if n := pending(t, c, in, "stage"); n != 0 {
			t.Fatalf("pending = %d", n)
		}
		ttl, err := c.Universal().PTTL(ctx, outs[0].DedupKey).Result()
		if err != nil || ttl <= 0 || ttl > time.Minute {
			t.Fatalf("marker ttl = %v, %v", ttl, err)
		}
		bad := outs[0]
		bad.DedupKey = k.Dedup("elsewhere", 9, "stage", "in", 0, "1-1", 0)
		if _, err := c.Commit(ctx, CommitArgs{Outputs: []Output{bad}}); err == nil || !strings.Contains(err.Error(), "hash slot") {
			t.Fatalf("dedup key in another slot: err = %v", err)
		}
	})
}

func BenchmarkCommit(b *testing.B) {
	c, err := Open(ctxB(b), Options{URLs: []string{redistest.Shared(b).URL()}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := ctxB(b)
	in := "bench:{commit:0}"
	defer c.Universal().Del(ctx, in, "bench:{commitout:0}")
	_ = c.EnsureGroup(ctx, in, "g")
	payload := []byte(`{"customer_id":"c-42","amount":99.5}`)
	const batch = 100
	for b.Loop() {
		b.StopTimer()
		pipe := c.Universal().Pipeline()
		for range batch {
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: in, Values: []any{"payload", payload}})
		}
		_, _ = pipe.Exec(ctx)
		rb, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "g", Consumer: "c", Block: -1})
		if err != nil {
			b.Fatal(err)
		}
		outs := make([]Output, len(rb.Entries))
		for i, e := range rb.Entries {
			outs[i] = Output{Stream: "bench:{commitout:0}", Entry: e}
		}
		b.StartTimer()
		if _, err := c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "g", IDs: rb.IDs()}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCommitCheckpoint: a source's batch records its checkpoint with its outputs, fenced by the
// source's lease; a process that lost the lease moves nothing.
func TestCommitCheckpoint(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		leaseKey, posKey := k.SourceLease("file"), k.SourcePosition("file")
		if HashSlot(leaseKey) != HashSlot(posKey) {
			t.Fatal("the position is not in its lease's slot")
		}
		lease, ok, err := c.AcquireLease(ctx, leaseKey, "owner-a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, found, err := c.ReadCheckpoint(ctx, posKey); err != nil || found {
			t.Fatalf("a checkpoint before any commit: %v, %v", found, err)
		}
		var outs []Output
		for i := range 10 {
			outs = append(outs, Output{Stream: k.Stream("out", i%4), Entry: Entry{Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}})
		}
		if _, err := c.Commit(ctx, CommitArgs{Outputs: outs, Lease: &lease, Checkpoint: &Checkpoint{Key: posKey, Value: "line 10"}}); err != nil {
			t.Fatal(err)
		}
		if v, found, err := c.ReadCheckpoint(ctx, posKey); err != nil || !found || v != "line 10" {
			t.Fatalf("checkpoint = %q, %v, %v; want line 10", v, found, err)
		}
		var total int64
		for p := range 4 {
			total += xlen(t, c, k.Stream("out", p))
		}
		if total != 10 {
			t.Fatalf("%d outputs written, want 10", total)
		}

		forceExpire(t, c, leaseKey)
		if _, ok, err := c.AcquireLease(ctx, leaseKey, "owner-b", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
		_, err = c.Commit(ctx, CommitArgs{Outputs: outs[:1], Lease: &lease, Checkpoint: &Checkpoint{Key: posKey, Value: "line 11"}})
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("a commit after the lease was lost: err = %v, want ErrLeaseLost", err)
		}
		if v, _, _ := c.ReadCheckpoint(ctx, posKey); v != "line 10" {
			t.Fatalf("the checkpoint moved to %q without the lease", v)
		}
		if _, err := c.Commit(ctx, CommitArgs{Lease: &lease, Checkpoint: &Checkpoint{Key: posKey, Value: "x"}, Stream: "s", Group: "g", IDs: []string{"1-0"}}); err == nil {
			t.Fatal("a commit with both a checkpoint and acks was accepted")
		}
	})
}

// failXAdds is a go-redis hook that fails, before they are sent, the commands and pipelines that
// hold an XADD, as a connection that breaks at that moment would.
type failXAdds struct{}

var errInjected = errors.New("injected: connection reset")

func (failXAdds) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (failXAdds) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "xadd" {
			cmd.SetErr(errInjected)
			return errInjected
		}
		return next(ctx, cmd)
	}
}

func (failXAdds) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "xadd" {
				for _, c := range cmds {
					c.SetErr(errInjected)
				}
				return errInjected
			}
		}
		return next(ctx, cmds)
	}
}

// TestCheckpointMovesOnlyWithItsOutputs: when a source's outputs cannot be written, its
// checkpoint does not move, so that no line is skipped at the next start.
func TestCheckpointMovesOnlyWithItsOutputs(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		posKey := k.SourcePosition("file")
		lease, ok, err := c.AcquireLease(ctx, k.SourceLease("file"), "owner", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		outs := []Output{{Stream: k.Stream("out", 0), Entry: Entry{Payload: []byte(`{"n":1}`)}},
			{Stream: k.Stream("out", 1), Entry: Entry{Payload: []byte(`{"n":2}`)}}}
		if _, err := c.Commit(ctx, CommitArgs{Outputs: outs, Lease: &lease, Checkpoint: &Checkpoint{Key: posKey, Value: "line 2"}}); err != nil {
			t.Fatal(err)
		}
		c.Universal().AddHook(failXAdds{})
		_, err = c.Commit(ctx, CommitArgs{Outputs: outs, Lease: &lease, Checkpoint: &Checkpoint{Key: posKey, Value: "line 4"}})
		if !errors.Is(err, errInjected) {
			t.Fatalf("commit with failing outputs: err = %v, want the injected failure", err)
		}
		if v, _, err := c.ReadCheckpoint(ctx, posKey); err != nil || v != "line 2" {
			t.Fatalf("checkpoint = %q, %v after its outputs failed; want it still at line 2", v, err)
		}
	})
}
