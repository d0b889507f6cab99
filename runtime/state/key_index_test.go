package state

import (
	"math/rand/v2"
	"testing"
)

// TestKeyIndexFindsWhatItHolds: through inserts and removals of keys whose hashes crowd a few
// slots (and wrap around the table's end), every key held is found at its place, and none removed.
func TestKeyIndexFindsWhatItHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := newKeyIndex()
	held := map[uint32]uint64{} // a key (its place's offset) and its hash
	match := func(key uint32) func(keyAt) bool { return func(at keyAt) bool { return at.offset == key } }
	for step := range 20_000 {
		key := uint32(rng.IntN(300))
		h := uint64(rng.IntN(8)) << 3 // eight homes a table apart at most, and 0
		if rng.IntN(2) == 0 {
			h = uint64(len(x.slots) - 1 - rng.IntN(3)) // the table's last slots: probes wrap
		}
		if old, ok := held[key]; ok {
			i, found := x.find(old, match(key))
			if !found {
				t.Fatalf("step %d: key %d of hash %d is not found", step, key, old)
			}
			x.remove(i)
			delete(held, key)
		} else {
			i, found := x.find(h, match(key))
			if found {
				t.Fatalf("step %d: key %d found before it was inserted", step, key)
			}
			x.insert(i, h, keyAt{record: 1, offset: key})
			held[key] = h
		}
		if x.size() != len(held) {
			t.Fatalf("step %d: the index holds %d keys, want %d", step, x.size(), len(held))
		}
		for k, h := range held {
			if i, found := x.find(h, match(k)); !found || x.slots[i].at.offset != k {
				t.Fatalf("step %d: key %d of hash %d is not found", step, k, h)
			}
		}
	}
}
