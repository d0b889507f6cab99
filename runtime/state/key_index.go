package state

// keyIndex finds where each key of a PackedKeys is set, by the key's 64-bit hash: an open-
// addressing table with linear probing, at most three quarters full, whose slots hold the hash and
// the place side by side. A lookup of a key that is not there (most of a dedupe's) reads one slot
// or a few neighbours, where a Go map read a table directory, a group's control word and then the
// slot. Keys whose hashes are equal take slots one after the other, as any others whose slots are
// taken; the caller tells them apart by the key at the place (its own func match).
//
// It holds no pointers, so the garbage collector does not look into it.
type keyIndex struct {
	slots []indexSlot
	n     int
}

// indexSlot is a key's hash (0: the slot is empty; a hash of 0 is kept as 1) and its place.
type indexSlot struct {
	hash uint64
	at   keyAt
}

// newKeyIndex returns an empty index. Its length is a power of two (grow doubles it): a hash's
// home slot is its low bits.
func newKeyIndex() keyIndex { return keyIndex{slots: make([]indexSlot, 64)} }

// find returns the slot of the key of hash h for which match says yes, and false with the empty
// slot where it would go when there is none.
func (x *keyIndex) find(h uint64, match func(keyAt) bool) (int, bool) {
	h = max(h, 1)
	mask := len(x.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		switch s := &x.slots[i]; {
		case s.hash == 0:
			return i, false
		case s.hash == h && match(s.at):
			return i, true
		}
	}
}

// touch reads the home slot of each hash, and returns nothing of use: the reads, which do not wait
// for one another, bring the slots into the processor's cache together, where the finds that
// follow would each wait for memory in turn (most of a dedupe's lookups, in a table of millions).
func (x *keyIndex) touch(hashes []uint64) uint64 {
	mask := len(x.slots) - 1
	var sum uint64
	for _, h := range hashes {
		sum += x.slots[int(max(h, 1))&mask].hash
	}
	return sum
}

// insert puts at into the empty slot i that find returned for hash h.
func (x *keyIndex) insert(i int, h uint64, at keyAt) {
	x.slots[i] = indexSlot{hash: max(h, 1), at: at}
	x.n++
	if 4*x.n > 3*len(x.slots) {
		x.grow()
	}
}

// grow doubles the table and puts every slot back.
func (x *keyIndex) grow() {
	old := x.slots
	x.slots = make([]indexSlot, 2*len(old))
	mask := len(x.slots) - 1
	for _, s := range old {
		if s.hash == 0 {
			continue
		}
		i := int(s.hash) & mask
		for x.slots[i].hash != 0 {
			i = (i + 1) & mask
		}
		x.slots[i] = s
	}
}

// remove empties slot i, and moves back the slots after it that probing would no longer reach
// (backward-shift deletion: no tombstones to skip or to clear).
func (x *keyIndex) remove(i int) {
	mask := len(x.slots) - 1
	for j := (i + 1) & mask; x.slots[j].hash != 0; j = (j + 1) & mask {
		home := int(x.slots[j].hash) & mask
		// Slot j may move to i when i lies on its way from home to j (cyclically).
		if (j-home)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.n--
}

// each calls f with the place of every key.
func (x *keyIndex) each(f func(keyAt)) {
	for _, s := range x.slots {
		if s.hash != 0 {
			f(s.at)
		}
	}
}

// size is how many keys it holds.
func (x *keyIndex) size() int { return x.n }
