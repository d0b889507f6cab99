package redis

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// bigPayload is a JSON payload of about n bytes, different for each tag.
func bigPayload(tag string, n int) []byte {
	return []byte(`{"tag":"` + tag + `","body":"` + strings.Repeat("x", n) + `"}`)
}

// offloadedRef returns the payload_ref of an entry as stored (raw XRANGE), "" when the entry holds
// its payload itself; it fails the test when the entry has both or neither.
func offloadedRef(t *testing.T, c *Client, stream, id string) string {
	t.Helper()
	msgs, err := c.Universal().XRangeN(ctxT(t), stream, id, id, 1).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("XRANGE %s %s: %v, %v", stream, id, msgs, err)
	}
	ref, hasRef := msgs[0].Values[FieldPayloadRef].(string)
	_, hasPayload := msgs[0].Values[FieldPayload]
	if hasRef == hasPayload {
		t.Fatalf("entry %s of %s has payload %v and payload_ref %v: want one of them", id, stream, hasPayload, hasRef)
	}
	return ref
}

func exists(t *testing.T, c *Client, key string) bool {
	t.Helper()
	n, err := c.Universal().Exists(ctxT(t), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestOffloadWrites writes a large and a small payload by every write path, and checks that the
// large one is stored under a key of its own in the stream's slot, listed in the stream's index,
// and read back whole by group reads, plain reads and EntryByID, while the small one stays inline.
func TestOffloadWrites(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		in := k.Stream("in", 0)
		fill(t, c, in, 1)
		if err := c.EnsureGroup(ctx, in, "stage"); err != nil {
			t.Fatal(err)
		}
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w", Block: -1})
		if err != nil || b.Len() != 1 {
			t.Fatal(b.Len(), err)
		}
		lease, _, err := c.AcquireLease(ctx, k.Lease("in", 0, "stage"), "w", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		type write struct {
			name  string
			write func(p int, outs []Output) ([]string, error) // outs to partition p of topic out
		}
		fenced := !c.cluster // a lease and a dedup key: onceScript on a single server
		writes := []write{
			{"commit", func(_ int, outs []Output) ([]string, error) {
				return c.Commit(ctx, CommitArgs{Outputs: outs})
			}},
			{"commit-dedup", func(p int, outs []Output) ([]string, error) {
				for i := range outs {
					outs[i].DedupKey = k.Dedup("out", p, "stage", "in", 0, "1-1", i)
				}
				return c.Commit(ctx, CommitArgs{Outputs: outs})
			}},
			{"commit-once", func(p int, outs []Output) ([]string, error) {
				for i := range outs {
					outs[i].DedupKey = k.Dedup("out", p, "stage", "in", 0, "1-2", i)
				}
				if !fenced {
					return c.Commit(ctx, CommitArgs{Outputs: outs})
				}
				return c.Commit(ctx, CommitArgs{Outputs: outs, Stream: in, Group: "stage", Lease: &lease, IDs: b.IDs()})
			}},
			{"append", func(p int, outs []Output) ([]string, error) {
				if err := c.Append(ctx, outs); err != nil {
					return nil, err
				}
				return lastIDs(t, c, k.Stream("out", p), len(outs)), nil
			}},
			{"producer", func(p int, outs []Output) ([]string, error) {
				prod, err := c.NewProducer(ProducerOptions{})
				if err != nil {
					return nil, err
				}
				defer prod.Close(ctx)
				for _, o := range outs {
					if err := prod.Add(ctx, o.Stream, o.Entry); err != nil {
						return nil, err
					}
				}
				if err := prod.Flush(ctx); err != nil {
					return nil, err
				}
				return lastIDs(t, c, k.Stream("out", p), len(outs)), nil
			}},
		}
		for i, w := range writes {
			t.Run(w.name, func(t *testing.T) {
				out := k.Stream("out", i)
				big, small := bigPayload(w.name, 4<<10), []byte(`{"small":true}`)
				ids, err := w.write(i, []Output{
					{Stream: out, Entry: Entry{Key: "k1", Payload: big, Headers: map[string]string{"h": "v"}}},
					{Stream: out, Entry: Entry{Key: "k2", Payload: small}},
				})
				if err != nil || len(ids) != 2 {
					t.Fatalf("write: %v, %v", ids, err)
				}
				ref := offloadedRef(t, c, out, ids[0])
				if ref == "" || !strings.HasPrefix(ref, out+":payload:") {
					t.Fatalf("large payload: payload_ref %q, want a key under %s:payload:", ref, out)
				}
				if HashSlot(ref) != HashSlot(out) || HashSlot(PayloadIndex(out)) != HashSlot(out) {
					t.Errorf("payload key %s is in slot %d, its stream in %d", ref, HashSlot(ref), HashSlot(out))
				}
				if got, err := c.Universal().Get(ctx, ref).Bytes(); err != nil || !bytes.Equal(got, big) {
					t.Fatalf("GET %s: %d bytes, %v; want the payload", ref, len(got), err)
				}
				members, err := c.Universal().ZRange(ctx, PayloadIndex(out), 0, -1).Result()
				if err != nil || len(members) != 1 || members[0] != ids[0]+" "+ref {
					t.Fatalf("index %v, %v; want [%q]", members, err, ids[0]+" "+ref)
				}
				if ref := offloadedRef(t, c, out, ids[1]); ref != "" {
					t.Fatalf("small payload offloaded to %s", ref)
				}

				// Every read gets the payload back.
				recs, err := c.Read(ctx, out, "0", 0, 0)
				if err != nil || len(recs) != 2 || recs[0].Malformed != nil || !bytes.Equal(recs[0].Payload, big) ||
					recs[0].Key != "k1" || recs[0].Headers["h"] != "v" || string(recs[1].Payload) != string(small) {
					t.Fatalf("Read: %+v, %v", recs, err)
				}
				if rec, ok, err := c.EntryByID(ctx, out, ids[0]); err != nil || !ok || !bytes.Equal(rec.Payload, big) {
					t.Fatalf("EntryByID: %v, %v", ok, err)
				}
				if err := c.EnsureGroup(ctx, out, "next"); err != nil {
					t.Fatal(err)
				}
				got, err := c.ReadGroup(ctx, ReadArgs{Stream: out, Group: "next", Consumer: "a", Block: -1})
				if err != nil || len(got.Entries) != 2 || !bytes.Equal(got.Entries[0].Payload, big) {
					t.Fatalf("ReadGroup: %d entries, %d malformed, %v", len(got.Entries), len(got.Malformed), err)
				}
				claimed, err := reclaimAll(t, c, out, "next")
				if err != nil || len(claimed.Entries) != 2 || !bytes.Equal(claimed.Entries[0].Payload, big) {
					t.Fatalf("Reclaim: %d entries, %d malformed %v, deleted %v, %v", len(claimed.Entries), len(claimed.Malformed), claimed.Malformed, claimed.Deleted, err)
				}
			})
		}
	})
}

// reclaimAll claims every pending entry of group for another consumer, once they are idle. Redis
// 7.0 stamps each entry of one read with its own millisecond, so they may become idle one after
// the other: it claims until none is pending for anyone else.
func reclaimAll(t *testing.T, c *Client, stream, group string) (ReclaimResult, error) {
	t.Helper()
	var res ReclaimResult
	var err error
	waitFor(t, "the pending entries to be claimed", func() bool {
		var more ReclaimResult
		more, err = c.Reclaim(ctxT(t), ReclaimArgs{Stream: stream, Group: group, Consumer: "b", MinIdle: time.Millisecond})
		for _, e := range more.Entries { // an entry claimed before may be claimed again
			if !slices.ContainsFunc(res.Entries, func(had Entry) bool { return had.ID == e.ID }) {
				res.Entries = append(res.Entries, e)
			}
		}
		res.Malformed = append(res.Malformed, more.Malformed...)
		res.Deleted = append(res.Deleted, more.Deleted...)
		if err != nil {
			return true
		}
		pend, perr := c.Universal().XPendingExt(ctxT(t), &goredis.XPendingExtArgs{Stream: stream, Group: group, Start: "-", End: "+", Count: 100}).Result()
		if perr != nil {
			err = perr
			return true
		}
		for _, p := range pend {
			if p.Consumer != "b" {
				return false
			}
		}
		return len(res.Entries)+len(res.Malformed) > 0
	})
	slices.SortFunc(res.Entries, func(a, b Entry) int {
		x, _ := parseID(a.ID)
		y, _ := parseID(b.ID)
		return x.compare(y)
	})
	return res, err
}

// lastIDs returns the IDs of the last n entries of a stream, oldest first.
func lastIDs(t *testing.T, c *Client, stream string, n int) []string {
	t.Helper()
	ids := remaining(t, c, stream)
	if len(ids) < n {
		t.Fatalf("%s has %d entries, want at least %d", stream, len(ids), n)
	}
	return ids[len(ids)-n:]
}

// TestOffloadTrimKeepsWhatAGroupNeeds trims a stream read by two groups: a payload goes with its
// entry, and only once neither group needs the entry any more.
func TestOffloadTrimKeepsWhatAGroupNeeds(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		s := k.Stream("t", 0)
		for _, g := range []string{"fast", "slow"} {
			if err := c.EnsureGroup(ctx, s, g); err != nil {
				t.Fatal(err)
			}
		}
		var outs []Output
		for i := range 4 {
			outs = append(outs, Output{Stream: s, Entry: Entry{Payload: bigPayload(fmt.Sprint(i), 2<<10)}})
		}
		ids, err := c.Commit(ctx, CommitArgs{Outputs: outs})
		if err != nil {
			t.Fatal(err)
		}
		refs := make([]string, len(ids))
		for i, id := range ids {
			refs[i] = offloadedRef(t, c, s, id)
		}
		readAndAck(t, c, s, "fast", 4)
		readAndAck(t, c, s, "slow", 2, 1) // the second entry stays pending, the rest are undelivered

		res, err := c.Trim(ctx, s, Retention{MaxLen: 1}, time.Now())
		if err != nil || res.Trimmed != 1 {
			t.Fatalf("Trim = %+v, %v; want the first entry trimmed", res, err)
		}
		for i, ref := range refs {
			if want := i > 0; exists(t, c, ref) != want {
				t.Errorf("entry %d: payload key exists = %v, want %v", i, !want, want)
			}
		}
		readAndAck(t, c, s, "slow", 0)
		if err := c.Ack(ctx, s, "slow", nil, ids[1]); err != nil {
			t.Fatal(err)
		}
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "slow", Consumer: "w", Block: -1})
		if err != nil || len(b.Entries) != 2 || !bytes.Equal(b.Entries[1].Payload, outs[3].Entry.Payload) {
			t.Fatalf("slow group read %d entries, %v", len(b.Entries), err)
		}
		if err := c.Ack(ctx, s, "slow", nil, b.IDs()[0]); err != nil {
			t.Fatal(err)
		}
		if res, err := c.Trim(ctx, s, Retention{MaxLen: 1}, time.Now()); err != nil || res.Trimmed != 2 {
			t.Fatalf("Trim = %+v, %v; want two more entries trimmed", res, err)
		}
		for i, ref := range refs {
			if want := i == 3; exists(t, c, ref) != want {
				t.Errorf("entry %d: payload key exists = %v, want %v", i, !want, want)
			}
		}
		if n, _ := c.Universal().ZCard(ctx, PayloadIndex(s)).Result(); n != 1 {
			t.Errorf("index holds %d members, want 1", n)
		}
	})
}

// TestOffloadDeleteEntries deletes entries and a whole stream: their payload keys go with them.
func TestOffloadDeleteEntries(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		s := k.DeadLetter("stage")
		ids, err := c.Commit(ctx, CommitArgs{Outputs: []Output{
			{Stream: s, Entry: Entry{Payload: bigPayload("a", 2<<10)}},
			{Stream: s, Entry: Entry{Payload: bigPayload("b", 2<<10)}},
			{Stream: s, Entry: Entry{Payload: bigPayload("c", 2<<10)}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		refs := []string{offloadedRef(t, c, s, ids[0]), offloadedRef(t, c, s, ids[1]), offloadedRef(t, c, s, ids[2])}
		if n, err := c.DeleteEntries(ctx, s, ids[1]); err != nil || n != 1 {
			t.Fatalf("DeleteEntries = %d, %v", n, err)
		}
		if !exists(t, c, refs[0]) || exists(t, c, refs[1]) || !exists(t, c, refs[2]) {
			t.Fatal("deleting the second entry did not delete exactly its payload")
		}
		if err := c.DeleteStream(ctx, s); err != nil {
			t.Fatal(err)
		}
		for _, key := range append(refs, s, PayloadIndex(s)) {
			if exists(t, c, key) {
				t.Errorf("%s exists after DeleteStream", key)
			}
		}
	})
}

// TestOffloadMissingPayload reads an entry whose payload key is gone, or whose payload_ref names a
// key of another stream: it is malformed (to be dead-lettered), and the read goes on.
func TestOffloadMissingPayload(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		s := k.Stream("m", 0)
		other := k.Stream("m", 1)
		rdb := c.Universal()
		for _, ref := range []string{PayloadKey(s, "gone"), PayloadKey(other, "elsewhere")} {
			if err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: s, Values: []any{FieldPayloadRef, ref}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := rdb.Set(ctx, PayloadKey(other, "elsewhere"), `{"a":1}`, 0).Err(); err != nil {
			t.Fatal(err)
		}
		fill(t, c, s, 1)
		if err := c.EnsureGroup(ctx, s, "g"); err != nil {
			t.Fatal(err)
		}
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w", Block: -1})
		if err != nil || len(b.Malformed) != 2 || len(b.Entries) != 1 {
			t.Fatalf("read %d entries and %d malformed, %v; want 1 and 2", len(b.Entries), len(b.Malformed), err)
		}
		if !strings.Contains(b.Malformed[0].Reason, "payload_ref") {
			t.Errorf("reason %q does not name payload_ref", b.Malformed[0].Reason)
		}
	})
}

// TestOffloadNoOrphanOnFailedWrite writes to a key that is not a stream: the commit fails and no
// payload key is left behind.
func TestOffloadNoOrphanOnFailedWrite(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		s := k.Stream("w", 0)
		if err := c.Universal().Set(ctx, s, "not a stream", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := c.Commit(ctx, CommitArgs{Outputs: []Output{{Stream: s, Entry: Entry{Payload: bigPayload("a", 2<<10)}}}})
		if err == nil {
			t.Fatal("commit to a string key succeeded")
		}
		keys, err := c.KeysUnder(ctx, k.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 {
			t.Errorf("keys after the failed write: %v; want only %s", keys, s)
		}
	})
}

// TestNoOffloadOnMiniredis: the embedded Redis keeps payloads in their entries whatever their size
// (see WithOffloadOver), and its reads still follow references that another writer made; trimming
// and deleting entries there still delete their payloads.
func TestNoOffloadOnMiniredis(t *testing.T) {
	forEach(t, []backend{miniredisBackend()}, func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		s := k.Stream("m", 0)
		big := bigPayload("a", 2<<10)
		ids, err := c.Commit(ctx, CommitArgs{Outputs: []Output{{Stream: s, Entry: Entry{Payload: big}}}})
		if err != nil {
			t.Fatal(err)
		}
		if ref := offloadedRef(t, c, s, ids[0]); ref != "" {
			t.Fatalf("offloaded to %s on miniredis", ref)
		}
		// An entry as a client of a real server wrote it: the reference, its key and its index.
		ref := PayloadKey(s, "by-hand")
		id, err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: s, Values: []any{FieldPayloadRef, ref}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Universal().Set(ctx, ref, big, 0).Err(); err != nil {
			t.Fatal(err)
		}
		ms, err := parseID(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Universal().ZAdd(ctx, PayloadIndex(s), goredis.Z{Score: float64(ms.ms), Member: id + " " + ref}).Err(); err != nil {
			t.Fatal(err)
		}
		recs, err := c.Read(ctx, s, "0", 0, 0)
		if err != nil || len(recs) != 2 || !bytes.Equal(recs[1].Payload, big) {
			t.Fatalf("Read: %d records, %v", len(recs), err)
		}
		if n, err := c.DeleteEntries(ctx, s, id); err != nil || n != 1 || exists(t, c, ref) {
			t.Fatalf("DeleteEntries: %d, %v; the payload's key exists: %v", n, err, exists(t, c, ref))
		}
	})
}

// largeOf is a payload written in pieces (Entry.Large): p, in pieces of n bytes whatever the chunk
// asked for, each in the memory of the one before (as Message.WritePayload reuses it). after, if
// not nil, runs once the last piece is written.
func largeOf(p []byte, n int, after func()) *LargePayload {
	return &LargePayload{Size: int64(len(p)), Write: func(chunk int, write func([]byte) error) error {
		if chunk <= 0 {
			return write(p)
		}
		piece := make([]byte, 0, n)
		for rest := p; len(rest) > 0; {
			k := min(n, len(rest))
			piece = append(piece[:0], rest[:k]...)
			if err := write(piece); err != nil {
				return err
			}
			rest = rest[k:]
		}
		if after != nil {
			after()
		}
		return nil
	}}
}

// stagedKeys returns the staging keys under prefix.
func stagedKeys(t *testing.T, c *Client, prefix string) []string {
	t.Helper()
	all, err := c.KeysUnder(ctxT(t), prefix)
	if err != nil {
		t.Fatal(err)
	}
	var staged []string
	for _, k := range all {
		if strings.HasSuffix(k, ":staged") {
			staged = append(staged, k)
		}
	}
	return staged
}

// stagedCommits are the ways a commit writes an output, for the tests of staged payloads: with and
// without a settle in the same step, with and without a dedup key, and under a lease (onceScript
// on a single server). Each writes outs to partition p of topic "out" and acks input entry id of
// stream in.
func stagedCommits(c *Client, k Keys, in string, lease *Lease) []struct {
	name   string
	commit func(ctx context.Context, p int, id string, outs []Output) ([]string, error)
} {
	settle := func(outs []Output, id string, lease *Lease) CommitArgs {
		return CommitArgs{Outputs: outs, Stream: in, Group: "stage", IDs: []string{id}, Lease: lease}
	}
	dedup := func(outs []Output, p int, id string) []Output {
		for i := range outs {
			outs[i].DedupKey = k.Dedup("out", p, "stage", "in", 0, id, i)
		}
		return outs
	}
	return []struct {
		name   string
		commit func(ctx context.Context, p int, id string, outs []Output) ([]string, error)
	}{
		{"settle", func(ctx context.Context, _ int, id string, outs []Output) ([]string, error) {
			return c.Commit(ctx, settle(outs, id, nil))
		}},
		{"settle-leased", func(ctx context.Context, _ int, id string, outs []Output) ([]string, error) {
			return c.Commit(ctx, settle(outs, id, lease))
		}},
		{"dedup-settle", func(ctx context.Context, p int, id string, outs []Output) ([]string, error) {
			return c.Commit(ctx, settle(dedup(outs, p, id), id, nil))
		}},
		{"once", func(ctx context.Context, p int, id string, outs []Output) ([]string, error) {
			return c.Commit(ctx, settle(dedup(outs, p, id), id, lease))
		}},
	}
}

// readForStagedCommits fills a stream "in" with four entries, reads them for the group "stage" as
// consumer "w" and takes that consumer's lease, as a stage does before it commits: what each
// stagedCommits path then commits for one entry of ids.
func readForStagedCommits(t *testing.T, c *Client, k Keys) (in string, ids []string, lease Lease) {
	t.Helper()
	ctx := ctxT(t)
	in = k.Stream("in", 0)
	ids = fill(t, c, in, 4)
	if err := c.EnsureGroupAt(ctx, in, "stage", "0"); err != nil {
		t.Fatal(err)
	}
	if b, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w", Count: 4, Block: -1}); err != nil || b.Len() != 4 {
		t.Fatal(b.Len(), err)
	}
	lease, _, err := c.AcquireLease(ctx, k.Lease("in", 0, "stage"), "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return in, ids, lease
}

// TestOffloadStagedPayloads commits large payloads that come in pieces (Entry.Large) by every path
// of Commit: each is staged, then renamed to its payload key by the script that writes its entry,
// and reads back whole; the payload key is persistent and no staging key is left.
func TestOffloadStagedPayloads(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		in, ids, lease := readForStagedCommits(t, c, k)
		for i, w := range stagedCommits(c, k, in, &lease) {
			t.Run(w.name, func(t *testing.T) {
				out := k.Stream("out", i)
				big := bigPayload(w.name, 4<<10)
				got, err := w.commit(ctx, i, ids[i], []Output{
					{Stream: out, Entry: Entry{Key: "k1", Large: largeOf(big, 1000, nil)}},
					{Stream: out, Entry: Entry{Key: "k2", Payload: []byte(`{"small":true}`)}},
				})
				if err != nil || len(got) != 2 {
					t.Fatalf("commit: %v, %v", got, err)
				}
				ref := offloadedRef(t, c, out, got[0])
				if ref == "" || !strings.HasPrefix(ref, out+":payload:") {
					t.Fatalf("payload_ref %q, want a key under %s:payload:", ref, out)
				}
				if ttl, err := c.Universal().PTTL(ctx, ref).Result(); err != nil || ttl != -1 {
					t.Errorf("payload key %s expires in %v (%v): want it persistent", ref, ttl, err)
				}
				recs, err := c.Read(ctx, out, "0", 0, 0)
				if err != nil || len(recs) != 2 || !bytes.Equal(recs[0].Payload, big) || recs[0].Key != "k1" {
					t.Fatalf("Read: %+v, %v", recs, err)
				}
				if s := stagedKeys(t, c, k.Prefix); len(s) > 0 {
					t.Errorf("staging keys left: %v", s)
				}
			})
		}
		pending, err := c.Universal().XPending(ctx, in, "stage").Result()
		if err != nil || pending.Count != 0 {
			t.Errorf("pending after the commits: %+v, %v; want none", pending, err)
		}
	})
}

// TestOffloadStagedPayloadCrash: a process that dies between staging a payload and its commit
// leaves no entry, only the staging key, which expires and which reset recognises as a payload of
// the topic. A commit whose staged payload is gone by then (expired, evicted) writes nothing and
// acks nothing, by every path.
func TestOffloadStagedPayloadCrash(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		out := k.Stream("out", 9)
		if _, err := c.stageLarge(ctx, []Output{{Stream: out, Entry: Entry{Large: largeOf(bigPayload("crash", 4<<10), 1000, nil)}}}); err != nil {
			t.Fatal(err)
		}
		all, err := c.KeysUnder(ctx, k.Prefix)
		if err != nil || len(all) != 1 || !strings.HasPrefix(all[0], out+":payload:") || !strings.HasSuffix(all[0], ":staged") {
			t.Fatalf("keys after staging: %v, %v; want one staging key of %s", all, err, out)
		}
		if ttl, err := c.Universal().PTTL(ctx, all[0]).Result(); err != nil || ttl <= 0 || ttl > stagingTTL {
			t.Errorf("the staging key expires in %v (%v), want within %v", ttl, err, stagingTTL)
		}
		if err := c.Universal().Del(ctx, all[0]).Err(); err != nil {
			t.Fatal(err)
		}

		in, ids, lease := readForStagedCommits(t, c, k)
		for i, w := range stagedCommits(c, k, in, &lease) {
			t.Run(w.name, func(t *testing.T) {
				out := k.Stream("out", i)
				// An entry written before, so that the output is a stream whatever the commit does.
				if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: out, Values: []any{FieldPayload, "{}"}}).Err(); err != nil {
					t.Fatal(err)
				}
				expire := func() { // what expiry or eviction would do between the staging and the commit
					for _, s := range stagedKeys(t, c, k.Prefix) {
						c.Universal().Del(ctx, s)
					}
				}
				_, err := w.commit(ctx, i, ids[i], []Output{
					{Stream: out, Entry: Entry{Key: "k0", Payload: []byte(`{"small":true}`)}},
					{Stream: out, Entry: Entry{Key: "k1", Large: largeOf(bigPayload(w.name, 4<<10), 1000, expire)}},
				})
				if err == nil {
					t.Fatal("the commit of a payload whose staging key is gone succeeded")
				}
				if n, err := c.Universal().XLen(ctx, out).Result(); err != nil || n > 2 {
					t.Errorf("%s holds %d entries (%v), want the one before and at most the small output", out, n, err)
				}
				msgs, err := c.Universal().XRange(ctx, out, "-", "+").Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					if _, isRef := m.Values[FieldPayloadRef]; isRef {
						t.Errorf("%s %s refers to a payload that was never written", out, m.ID)
					}
				}
				if n, err := c.Universal().ZCard(ctx, PayloadIndex(out)).Result(); err != nil || n != 0 {
					t.Errorf("payload index of %s: %d members, %v", out, n, err)
				}
				pending, err := c.Universal().XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: in, Group: "stage", Start: ids[i], End: ids[i], Count: 1}).Result()
				if err != nil || len(pending) != 1 {
					t.Errorf("input %s was acked (%v) though its output was not written", ids[i], err)
				}
			})
		}
	})
}

// TestOffloadStagedPayloadLostWhileStaged: a staging key that expires or is evicted between two of
// its pieces (or loses its last pieces in a failover) is not taken for the payload. A SETRANGE on
// a key that is gone would make a new one, zeros up to the piece's offset and without a time to
// live, that a commit would then rename into place and ack its input with: its entry's payload
// would be NUL bytes where the first pieces were. Instead the commit fails, writes nothing and acks
// nothing, by every path, and leaves no key without a time to live.
func TestOffloadStagedPayloadLostWhileStaged(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		c = c.WithOffloadOver(1 << 10)
		in, ids, lease := readForStagedCommits(t, c, k)
		for i, w := range stagedCommits(c, k, in, &lease) {
			t.Run(w.name, func(t *testing.T) {
				out := k.Stream("out", i)
				big := bigPayload(w.name, 4<<10)
				pieces := 0
				lost := &LargePayload{Size: int64(len(big)), Write: func(chunk int, write func([]byte) error) error {
					if chunk <= 0 {
						return write(big)
					}
					for rest := big; len(rest) > 0; {
						n := min(1000, len(rest))
						if err := write(rest[:n]); err != nil {
							return err
						}
						rest = rest[n:]
						if pieces++; pieces == 2 { // what expiry or eviction does between two pieces
							for _, s := range stagedKeys(t, c, k.Prefix) {
								c.Universal().Del(ctx, s)
							}
						}
					}
					return nil
				}}
				got, err := w.commit(ctx, i, ids[i], []Output{{Stream: out, Entry: Entry{Key: "k1", Large: lost}}})
				if err == nil {
					recs, rerr := c.Read(ctx, out, "0", 0, 0)
					if rerr != nil || len(recs) != 1 || !bytes.Equal(recs[0].Payload, big) {
						t.Fatalf("committed %v with a payload staged in part: %d records %.40q, %v", got, len(recs), recs[0].Payload, rerr)
					}
					return
				}
				if n, err := c.Universal().XLen(ctx, out).Result(); err != nil || n != 0 {
					t.Errorf("%s holds %d entries (%v), want none", out, n, err)
				}
				pending, err := c.Universal().XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: in, Group: "stage", Start: ids[i], End: ids[i], Count: 1}).Result()
				if err != nil || len(pending) != 1 {
					t.Errorf("input %s was acked (%v) though its output was not written", ids[i], err)
				}
				all, err := c.KeysUnder(ctx, k.Prefix)
				if err != nil {
					t.Fatal(err)
				}
				for _, key := range all {
					if strings.Contains(key, ":payload:") {
						if ttl, err := c.Universal().PTTL(ctx, key).Result(); err != nil || ttl < 0 {
							t.Errorf("%s is left without a time to live (%v, %v)", key, ttl, err)
						}
					}
				}
			})
		}
	})
}

// TestStagePieceSentAgain: a piece that the client sends again (its reply was lost) lands where it
// was, and the last one sent again after the payload was renamed whole to its staged key writes
// nothing; a piece whose predecessors are gone is refused.
func TestStagePieceSentAgain(t *testing.T) {
	forEach(t, realBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		key := PayloadKey(k.Stream("out", 0), nextPayloadToken())
		keys := []string{piecesKey(key), stagingKey(key)}
		send := func(at int, piece string) error {
			return stagePieceScript.Run(ctx, c.rdb, keys, at, piece, 9, 60000).Err()
		}
		for _, step := range []struct {
			at    int
			piece string
		}{{0, "abc"}, {3, "def"}, {3, "def"}, {6, "ghi"}, {6, "ghi"}} {
			if err := send(step.at, step.piece); err != nil {
				t.Fatalf("piece at %d: %v", step.at, err)
			}
		}
		if got, err := c.Universal().Get(ctx, keys[1]).Result(); err != nil || got != "abcdefghi" {
			t.Fatalf("staged %q, %v", got, err)
		}
		if n, err := c.Universal().Exists(ctx, keys[0]).Result(); err != nil || n != 0 {
			t.Errorf("the pieces' key is left: %d, %v", n, err)
		}
		if err := send(3, "def"); err == nil || !isUnwritten(err) {
			t.Errorf("a middle piece after its predecessors are gone: %v, want UNWRITTEN", err)
		}
	})
}

// TestOffloadUntaggedStreamOnACluster: on a cluster a payload goes under a key of its own only when
// that key is in its stream's slot, which a stream without a hash tag does not ensure: its payload
// key hashes whole, token and all. A stream whose name happens to share its slot with the key of
// one token (here "x") is no exception: its large payloads stay in their entries, and the writes
// work, rather than failing on keys of two slots.
func TestOffloadUntaggedStreamOnACluster(t *testing.T) {
	c := clusterBackend().open(t).WithOffloadOver(1 << 10)
	ctx := ctxT(t)
	k := testKeys(t)
	var stream string
	for i := 0; stream == ""; i++ {
		if s := strings.ReplaceAll(k.Prefix, "{", "(") + ":untagged:" + strconv.Itoa(i); HashSlot(PayloadKey(s, "x")) == HashSlot(s) {
			stream = s
		}
	}
	defer c.Universal().Del(ctx, stream)
	big := bigPayload("untagged", 4<<10)
	if _, err := c.Commit(ctx, CommitArgs{Outputs: []Output{{Stream: stream, Entry: Entry{Payload: big}}}}); err != nil {
		t.Fatalf("commit to %s: %v", stream, err)
	}
	if _, err := c.Commit(ctx, CommitArgs{Outputs: []Output{{Stream: stream, Entry: Entry{Large: largeOf(big, 1000, nil)}}}}); err != nil {
		t.Fatalf("commit of a staged payload to %s: %v", stream, err)
	}
	recs, err := c.Read(ctx, stream, "0", 0, 0)
	if err != nil || len(recs) != 2 || !bytes.Equal(recs[0].Payload, big) || !bytes.Equal(recs[1].Payload, big) {
		t.Fatalf("Read: %d records, %v", len(recs), err)
	}
}
