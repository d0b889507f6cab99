package state

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// packedOwner runs batches of a stage that packs its keys on one partition, as a worker does, and
// keeps what the state should hold (want) beside them.
type packedOwner struct {
	t      *testing.T
	c      *redis.Client
	keys   Keys
	packed *PackedKeys
	want   map[string]string
}

func newPackedOwner(t *testing.T, c *redis.Client, sameHash bool) *packedOwner {
	o := &packedOwner{t: t, c: c, keys: Keys{Hash: "state", Timers: "timers"}, packed: newPackedKeys(sameHash), want: map[string]string{}}
	o.load()
	return o
}

func (o *packedOwner) load() {
	o.t.Helper()
	if err := o.packed.Load(context.Background(), o.c, o.keys.Hash); err != nil {
		o.t.Fatal(err)
	}
}

// batch processes one batch: puts of the keys in set, deletes of those in deleted (each read
// first, as a dedupe reads its keys), and a count of keys, over the batch before, whose commit may
// be in flight (nil: none).
func (o *packedOwner) batch(before *Batch, set map[string]string, deleted []string) *Batch {
	o.t.Helper()
	ctx := context.Background()
	b := NewBatch(o.c, o.keys, 0, nil, o.packed)
	b.Over(before)
	var keys []string
	for k := range set {
		keys = append(keys, k)
	}
	keys = append(keys, deleted...)
	b.Prefetch(ctx, append(keys, stages.KeyCountKey))
	for k, v := range set {
		a := b.Attempt(0)
		if _, _, err := a.Get(ctx, k); err != nil {
			o.t.Fatal(err)
		}
		if err := a.Put(ctx, k, []byte(v)); err != nil {
			o.t.Fatal(err)
		}
		a.Join()
	}
	for _, k := range deleted {
		a := b.Attempt(0)
		if err := a.Delete(ctx, k); err != nil {
			o.t.Fatal(err)
		}
		a.Join()
	}
	a := b.Attempt(0)
	if err := a.Put(ctx, stages.KeyCountKey, []byte(strconv.Itoa(len(set)))); err != nil {
		o.t.Fatal(err)
	}
	a.Join()
	b.Settled()
	return b
}

// commit writes what the batch wrote to Redis, as a commit that ended well does, unless lost.
func (o *packedOwner) commit(b *Batch, w *redis.StateWrites, lost bool) {
	o.t.Helper()
	ctx := context.Background()
	if !lost && w != nil {
		u := o.c.Universal()
		for k, v := range w.Set {
			if err := u.HSet(ctx, w.Key, k, v).Err(); err != nil {
				o.t.Fatal(err)
			}
		}
		if len(w.Delete) > 0 {
			if err := u.HDel(ctx, w.Key, w.Delete...).Err(); err != nil {
				o.t.Fatal(err)
			}
		}
	}
}

// applied makes want what the batch leaves.
func (o *packedOwner) applied(set map[string]string, deleted []string) {
	for k, v := range set {
		o.want[k] = v
	}
	for _, k := range deleted {
		delete(o.want, k)
	}
}

// check compares what the owner knows, and what a new owner would read, with want.
func (o *packedOwner) check(step int) {
	o.t.Helper()
	if got := o.packed.Keys(); !maps.Equal(got, o.want) {
		o.t.Fatalf("step %d: the owner knows %v, want %v", step, got, o.want)
	}
	read, err := ReadPackedKeys(context.Background(), o.c, o.keys.Hash)
	if err != nil {
		o.t.Fatalf("step %d: %v", step, err)
	}
	if got := read.Keys(); !maps.Equal(got, o.want) {
		o.t.Fatalf("step %d: a new owner reads %v, want %v", step, got, o.want)
	}
	for k, v := range o.want {
		if got, found := o.packed.get(k); !found || string(got) != v {
			o.t.Fatalf("step %d: %s is %q, %v; want %q", step, k, got, found, v)
		}
	}
}

// randomChanges draws a batch's changes to a few of 40 keys: each set or deleted.
func randomChanges(rng *rand.Rand, step int) (map[string]string, []string) {
	set := map[string]string{}
	var deleted []string
	for range rng.IntN(8) {
		k := "k" + strconv.Itoa(rng.IntN(40))
		if _, twice := set[k]; twice || slices.Contains(deleted, k) {
			continue
		}
		if rng.IntN(3) > 0 {
			set[k] = strconv.Itoa(step)
		} else {
			deleted = append(deleted, k)
		}
	}
	return set, deleted
}

// TestPackedKeysAreWhatTheCommitsLeft: through batches that set and delete keys, one after another
// or over the batch before while it commits, commits that end well, are lost, or end without a
// known outcome, the owner knows each key's value as the commits that ended well left it, and a new
// owner reads the same from Redis. Records are deleted once they hold no key: when every key is
// deleted, none is left. The same holds when all keys have the same hash (the owner finds keys by
// a 64-bit hash of theirs, and two may share one).
func TestPackedKeysAreWhatTheCommitsLeft(t *testing.T) {
	for seed := range uint64(24) {
		sameHash := seed%4 == 3
		t.Run(fmt.Sprintf("%d/same hash %v", seed, sameHash), func(t *testing.T) {
			_, c := open(t)
			rng := rand.New(rand.NewPCG(seed, 7))
			o := newPackedOwner(t, c, sameHash)
			for step := range 200 {
				set, deleted := randomChanges(rng, step)
				b := o.batch(nil, set, deleted)
				w := b.Writes()
				switch rng.IntN(10) {
				case 0: // lost: Redis never had it
					o.commit(b, w, true)
					o.packed.Forget()
					o.load()
				case 1: // applied, but the reply was lost
					o.commit(b, w, false)
					o.applied(set, deleted)
					o.packed.Forget()
					o.load()
				case 2, 3, 4: // the next batch is processed while this one commits
					set2, deleted2 := randomChanges(rng, step+1000)
					next := o.batch(b, set2, deleted2)
					w2 := next.Writes()
					o.commit(b, w, false)
					b.Committed()
					o.applied(set, deleted)
					o.commit(next, w2, false)
					next.Committed()
					o.applied(set2, deleted2)
				default:
					o.commit(b, w, false)
					b.Committed()
					o.applied(set, deleted)
				}
				o.check(step)
			}
			// Every key deleted: two batches later, no record is left.
			var all []string
			for k := range o.want {
				all = append(all, k)
			}
			for i := range 3 {
				b := o.batch(nil, nil, all)
				o.commit(b, b.Writes(), false)
				b.Committed()
				o.applied(nil, all)
				o.check(1000 + i)
				all = nil
			}
			fields, err := c.Universal().HKeys(context.Background(), o.keys.Hash).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fields {
				if strings.HasPrefix(f, redis.PackedKeysField) {
					t.Errorf("a record is left once every key is deleted: %q of %q", f, fields)
				}
			}
		})
	}
}

// FuzzPackedRecord: a record that another client wrote, or that was cut short, is read or refused
// with the byte where it went wrong, never a crash; one that is read gives its keys as written.
func FuzzPackedRecord(f *testing.F) {
	f.Add(appendPacked(appendPacked(nil, '+', "k1", []byte("1000")), '-', "k2", nil))
	f.Add([]byte("+\x02k1\x041000"))
	f.Add([]byte("+\x02k1\x05100"))
	f.Add([]byte("-\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	f.Add([]byte("*"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := newPackedKeys(false)
		r := &packedRecord{number: 1, data: data}
		p.records, p.numbered[1] = append(p.records, r), r
		if err := p.apply(r); err != nil {
			if !strings.HasPrefix(err.Error(), "at byte ") {
				t.Fatalf("an error that says not where: %v", err)
			}
			return
		}
		// Read again from what it holds, the record gives the same keys.
		var again []byte
		for k, v := range p.Keys() {
			again = appendPacked(again, '+', k, []byte(v))
		}
		q := newPackedKeys(false)
		r2 := &packedRecord{number: 1, data: again}
		q.records, q.numbered[1] = append(q.records, r2), r2
		if err := q.apply(r2); err != nil || !maps.Equal(q.Keys(), p.Keys()) {
			t.Fatalf("written again, the keys %v read as %v (%v)", p.Keys(), q.Keys(), err)
		}
		if n := p.numbered[1].keys; n != len(p.Keys()) {
			t.Fatalf("the record holds %d keys by its count, %d in the index", n, len(p.Keys()))
		}
	})
}
