package state

import (
	"bytes"
	"context"
	"hash/maphash"
	"math/bits"
	"strings"
	"sync"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// A batch reads ahead the state keys its messages will read (Batch.Prefetch). For a kind whose
// messages mostly bring keys the state does not hold yet (a dedupe's new keys, an aggregate's new
// windows), that read finds nothing, and it costs more than its own time: sent while the batch
// before commits, it waits behind that commit in Redis, and the batch is processed only once both
// are done, where a stateless stage's next batch is processed while the commit runs.
//
// The owner of a partition is the only writer of its state while it holds the lease, so it can know
// which keys the state cannot hold: HeldKeys keeps the 64-bit hashes of every key that the hash may
// hold, loaded once (a scan of the hash) and then kept by the owner's own commits. A key whose hash
// it does not have is not in the state, and is not read; one whose hash it has may be (a deleted key
// stays until the next load, and another key may share its hash), and is read as before. So it is
// never wrong in the direction that matters, and a wrong "may hold" costs a read. (A Bloom filter
// would take less memory, but at 1 % of false "may hold" nearly every batch of a thousand new keys
// would still read.)
//
// The owner keeps, besides, the values its commits gave the state's own entries (those whose names
// begin with a NUL byte: the count of a kind's keys, the partition's watermark), which every batch of
// a kind that counts its keys reads, and which no one else writes while it holds the lease.
//
// It is worth what the lease is worth: a new owner (this process again, after losing the lease)
// starts a new one. A commit that ended without a known outcome, or a lost lease, forgets it
// (Forget). Once the keys deleted since a load are three times those left, the keys are loaded
// again beside the set, which they replace once loaded: a deleted key's hash stays until then.
// A state of more than maxHeldKeys keys is not known at all: it is read as before.

// The bounds of a set of hashes, which takes 10.7 to 21 bytes of memory a hash (keySet): it holds
// at most maxHeldKeys, and at most heldStaleFactor deleted keys to each key the state holds (past
// minHeldKeys deleted), so that loading again scans at most one key of the state for every
// heldStaleFactor keys deleted.
const (
	heldStaleFactor = 3
	minHeldKeys     = 1 << 14
	maxHeldKeys     = 1 << 21 // at most 32 MiB of hashes
	scanPage        = 1000
)

// HeldKeys is what the owner of a partition knows of the keys its state hash holds (see above).
// Its methods may be called concurrently; a nil *HeldKeys knows nothing.
type HeldKeys struct {
	seed maphash.Seed

	mu sync.Mutex
	// known holds the hashes of every key of the state, nil until loaded; next is the set being
	// loaded, to replace it. Commits add their keys to both.
	known, next *keySet
	// loading: a load is under way (Load); tooMany: the state held more than maxHeldKeys.
	loading, tooMany bool
	// own holds the values that the owner's commits gave the state's own entries.
	own map[string][]byte
}

// NewHeldKeys returns the knowledge of a partition's keys of a new lease term: none yet, until
// Load.
func NewHeldKeys() *HeldKeys {
	return &HeldKeys{seed: maphash.MakeSeed()}
}

// Absent reports whether the hash does not hold key: false when it may, or when the keys are not
// loaded.
func (h *HeldKeys) Absent(key string) bool {
	if h == nil {
		return false
	}
	fp := maphash.String(h.seed, key)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.known != nil && !h.known.has(fp)
}

// Own returns the value that the owner's last commit of one of the state's own entries gave it
// (see above), and false when it wrote none since the lease began, or forgot it.
func (h *HeldKeys) Own(key string) ([]byte, bool) {
	if h == nil || !isOwnEntry(key) {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.own[key]
	return v, ok
}

// isOwnEntry reports whether a key of the state hash is one of flowrun's own entries.
func isOwnEntry(key string) bool { return strings.HasPrefix(key, "\x00") }

// Committed adds what a commit which ended well set, and drops the own entries it deleted. The
// hashes of the keys it deleted stay until a load replaces them: another key the state holds may
// have the same hash.
func (h *HeldKeys) Committed(set map[string][]byte, deleted []string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range deleted {
		delete(h.own, k)
		if h.known != nil {
			h.known.deleted++
		}
		if h.next != nil {
			h.next.deleted++
		}
	}
	for k, v := range set {
		if strings.HasPrefix(k, redis.PackedKeysField) {
			continue // a record of keys (PackedKeys), which no batch reads
		}
		if isOwnEntry(k) {
			if h.own == nil {
				h.own = map[string][]byte{}
			}
			h.own[k] = bytes.Clone(v)
		}
		if h.known == nil && h.next == nil {
			continue
		}
		fp := maphash.String(h.seed, k)
		if h.known != nil {
			h.known.add(fp)
		}
		if h.next != nil {
			h.next.add(fp)
		}
	}
	if h.known != nil && h.known.n > maxHeldKeys {
		h.known, h.next, h.tooMany = nil, nil, true
	}
}

// Forget drops what is known: a commit ended without a known outcome, and the keys it set may or
// may not be in the hash. A load under way is dropped too; the next Wants starts another.
func (h *HeldKeys) Forget() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.known, h.next = nil, nil
	clear(h.own)
}

// Wants reports whether a load should start: none was done, or the known keys' set is stale, and
// none is under way. A true answer takes the load on: the caller runs Load.
func (h *HeldKeys) Wants() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loading || h.tooMany || (h.known != nil && !h.known.stale()) {
		return false
	}
	h.loading = true
	return true
}

// KeyStore is what Load reads: the fields of a state hash. *redis.Client is one.
type KeyStore interface {
	ScanState(ctx context.Context, hash string, cursor uint64, count int64) ([]redis.StateEntry, uint64, error)
}

// Load reads every key of hash into a new set, which then replaces the one in use, if any: the
// keys the hash held throughout the scan are in it, and those that commits set meanwhile are added
// by Committed. A failed read, or a Forget meanwhile, leaves what was known as it was; a later Wants
// starts again. Called after Wants said so, once at a time.
func (h *HeldKeys) Load(ctx context.Context, store KeyStore, hash string) error {
	defer func() {
		h.mu.Lock()
		h.loading = false
		h.mu.Unlock()
	}()
	f := newKeySet(0)
	h.mu.Lock()
	h.next = f // a Forget drops it, and the load with it
	h.mu.Unlock()
	var cursor uint64
	for {
		entries, next, err := store.ScanState(ctx, hash, cursor, scanPage)
		if err != nil {
			h.drop(f)
			return err
		}
		fps := make([]uint64, len(entries))
		for i, e := range entries {
			fps[i] = maphash.String(h.seed, e.Key)
		}
		h.mu.Lock()
		if h.next != f {
			h.mu.Unlock()
			return nil // forgotten meanwhile
		}
		for _, fp := range fps {
			f.add(fp)
		}
		if f.n > maxHeldKeys {
			h.known, h.next, h.tooMany = nil, nil, true
			h.mu.Unlock()
			return nil
		}
		if next == 0 {
			h.known, h.next = f, nil
			h.mu.Unlock()
			return nil
		}
		h.mu.Unlock()
		cursor = next
	}
}

// drop gives up the load of f.
func (h *HeldKeys) drop(f *keySet) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.next == f {
		h.next = nil
	}
}

// keySet is a set of the 64-bit hashes of keys: an open-addressing table with linear probing, at
// most three quarters full, in 10.7 to 21 bytes a hash; a Go map took 25. (Its memory lives as long
// as the lease, and the GOGC of 400 that cmd sets lets the heap grow to five times what lives.)
type keySet struct {
	slots   []uint64 // 0: empty; a hash of 0 is kept as 1
	n       int      // hashes held
	deleted int      // keys deleted since the set was loaded, whose hashes it keeps
}

func newKeySet(size int) *keySet {
	f := &keySet{}
	f.resize(max(64, size+size/3))
	return f
}

// resize makes the table a power of two of slots, at least want, and puts the hashes back in.
func (f *keySet) resize(want int) {
	old := f.slots
	f.slots = make([]uint64, 1<<bits.Len(uint(want-1)))
	f.n = 0
	for _, fp := range old {
		if fp != 0 {
			f.add(fp)
		}
	}
}

func (f *keySet) add(fp uint64) {
	fp = max(fp, 1)
	if 4*(f.n+1) > 3*len(f.slots) {
		f.resize(2 * len(f.slots))
	}
	mask := uint64(len(f.slots) - 1)
	for i := fp & mask; ; i = (i + 1) & mask {
		switch f.slots[i] {
		case fp:
			return
		case 0:
			f.slots[i] = fp
			f.n++
			return
		}
	}
}

func (f *keySet) has(fp uint64) bool {
	fp = max(fp, 1)
	mask := uint64(len(f.slots) - 1)
	for i := fp & mask; ; i = (i + 1) & mask {
		switch f.slots[i] {
		case fp:
			return true
		case 0:
			return false
		}
	}
}

// stale reports whether the set keeps more than heldStaleFactor hashes of deleted keys to each of
// the keys left (see the bounds above).
func (f *keySet) stale() bool {
	return f.deleted > minHeldKeys && f.deleted > heldStaleFactor*(f.n-f.deleted)
}
