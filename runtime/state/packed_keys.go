package state

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// A kind whose messages mostly bring keys its state does not hold yet, each with a small value
// that a timer forgets in time (a dedupe's remembered keys), would write a field of the state hash
// per new key: Redis spends about as long on that field as on the XADD of an output. Such a kind
// packs its keys instead (stages.StatefulStage.PacksKeys):
//
//   - A batch's commit writes the keys the batch set and deleted as one field of the state hash, a
//     record (named redis.PackedKeysField and the record's number, which grows with each record
//     written), beside the kind's other state entries (those whose names begin with a NUL byte:
//     the count of its keys), which stay fields of their own.
//   - The partition's owner keeps every key and its value in memory (PackedKeys), with the state's
//     own entries: it reads the state hash once, before its first batch, and then keeps them by
//     its own commits. Its batches read them from there, never from Redis.
//   - A record is deleted once it holds no key that a later record did not set again or delete,
//     and once every record before it is deleted: a record's deletions are of keys that earlier
//     records set, which would come back with them.
//
// Records read in the order of their numbers give every key's value as the last commit left it,
// so a new owner (this process again, after a lost lease or a failed commit) finds what the last
// one knew. The fields that an earlier flowrun wrote, a key each, are read with the records, as
// older than all of them; a batch that sets or deletes such a key deletes its field.
//
// A record holds, for each key the batch set, a '+', the key's length (a uvarint, as
// encoding/binary writes it), the key, the value's length and the value; for each key it deleted,
// a '-', the key's length and the key.

// PackedKeys is what the owner of a partition knows of the keys of a stage that packs them: all of
// them, and their values, as of its last commit (see above). Its methods may be called
// concurrently; a nil *PackedKeys is of a stage that does not pack its keys.
//
// It keeps the records as they are in Redis, and finds a key's value in them by the key's hash
// (keyIndex): a map of a key and a value each took twice the memory, and the garbage collector
// went through all of it at every cycle.
type PackedKeys struct {
	mu sync.Mutex
	// loaded: what it holds is what Redis holds, but for the commits that ended since. stale: a
	// commit ended without a known outcome (Forget), and the state is read again before the next
	// batch; forgets counts the Forget calls, so that a read that one overtook stays stale.
	loaded, stale bool
	forgets       int
	seed          maphash.Seed
	// sameHash gives every key the hash 1: tests make the keys collide so.
	sameHash bool
	// index finds each key of a record by its hash. hashes and entries are lookAhead's and
	// apply's memory; touched keeps
	// what keyIndex.touch read, so that the reads are not left out.
	index   keyIndex
	hashes  []uint64
	entries []packedEntry
	touched uint64
	// fields are the fields of a key each: the state's own entries, and the keys an earlier
	// flowrun wrote (oldFields of them).
	fields    map[string][]byte
	oldFields int
	// records are the records that hold a key, or follow one that does, oldest first; numbered
	// finds them by number.
	records  []*packedRecord
	numbered map[uint64]*packedRecord
	// next is the number of the last record written, committedUntil that of the last one whose
	// commit ended well (or that was read).
	next, committedUntil uint64
	// dropping are the records that hold no key, which the next commit deletes, oldest first.
	dropping []uint64
}

// keyAt is where a key is set: a record, and the offset of the key's entry in it.
type keyAt struct {
	record uint64
	offset uint32
}

// packedRecord is a record as written, and how many keys hold the value it set.
type packedRecord struct {
	number uint64
	keys   int
	data   []byte
}

// NewPackedKeys returns the keys of a lease term, to be read before the first batch (Load).
func NewPackedKeys() *PackedKeys { return newPackedKeys(false) }

func newPackedKeys(sameHash bool) *PackedKeys {
	return &PackedKeys{seed: maphash.MakeSeed(), sameHash: sameHash, index: newKeyIndex(),
		fields: map[string][]byte{}, numbered: map[uint64]*packedRecord{}}
}

// hash returns the hash of key in index.
func (p *PackedKeys) hash(key string) uint64 {
	if p.sameHash {
		return 1
	}
	return maphash.String(p.seed, key)
}

// Load reads the state hash, unless it was read and nothing was forgotten since. Called before a
// batch reads the state, never while another batch is processed: a failed commit gives up the
// batch processed meanwhile.
func (p *PackedKeys) Load(ctx context.Context, store KeyStore, hash string) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	current, forgets := p.loaded && !p.stale, p.forgets
	p.mu.Unlock()
	if current {
		return nil
	}
	read, err := readPackedKeys(ctx, store, hash, p.sameHash)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.loaded, p.stale = true, p.forgets != forgets
	p.seed, p.index, p.fields, p.oldFields = read.seed, read.index, read.fields, read.oldFields
	p.records, p.numbered, p.committedUntil, p.dropping = read.records, read.numbered, read.next, read.dropping
	// A number written once is not written again, though Redis may not hold its record: a commit
	// whose outcome was not known might yet come to be applied, and would overwrite another's.
	p.next = max(p.next, read.next)
	return nil
}

// Forget marks what is known stale: a commit ended without a known outcome, and Redis may or may
// not hold what it wrote. The batch processed meanwhile still reads the keys as they were (it is
// given up); the next one reads them again (Load).
func (p *PackedKeys) Forget() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stale = true
	p.forgets++
}

// get returns the value of key, and false when the state does not hold it.
func (p *PackedKeys) get(key string) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.valueOf(key, p.hash(key))
}

// lookAhead puts the values of keys into values (nil for a key the state does not hold), for a
// batch to read them from there (Batch.Prefetch). Looked up in a row, the keys' places in the
// index are fetched from memory side by side: one by one, between the messages' other work, each
// waited for memory on its own, and that was a fifth of a dedupe's time.
func (p *PackedKeys) lookAhead(keys []string, values map[string][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hashes = p.hashes[:0]
	for _, k := range keys {
		p.hashes = append(p.hashes, p.hash(k))
	}
	p.touched += p.index.touch(p.hashes)
	for i, k := range keys {
		values[k], _ = p.valueOf(k, p.hashes[i])
	}
}

// valueOf returns the value of key, whose hash is h, and false when the state does not hold it.
func (p *PackedKeys) valueOf(key string, h uint64) ([]byte, bool) {
	if !isOwnEntry(key) {
		if i, found := p.findHashed(key, h); found {
			return p.valueAt(p.index.slots[i].at), true
		}
	}
	v, found := p.fields[key]
	return v, found
}

// findHashed returns the slot of key, of hash h, in the index, or the empty slot where it would go.
func (p *PackedKeys) findHashed(key string, h uint64) (int, bool) {
	return p.index.find(h, func(at keyAt) bool { return p.keyAt(at) == key })
}

// keyAt returns the key of an entry; valueAt its value.
func (p *PackedKeys) keyAt(at keyAt) string {
	key, _, _ := packedBytes(p.numbered[at.record].data[at.offset+1:])
	return unsafeString(key)
}

func (p *PackedKeys) valueAt(at keyAt) []byte {
	_, rest, _ := packedBytes(p.numbered[at.record].data[at.offset+1:])
	v, _, _ := packedBytes(rest)
	return v[:len(v):len(v)]
}

// packedWrite is what a batch's commit writes of the keys it packs: a record, the state's own
// entries that it changes, and the fields it deletes.
type packedWrite struct {
	record uint64 // its number; 0: it writes none
	value  []byte
	// own are the state's own entries it sets, ownDeleted those it deletes.
	own        map[string][]byte
	ownDeleted []string
	// recordsDeletes: the record holds the keys the batch deleted.
	recordsDeletes bool
	// deletes are the fields of keys that an earlier flowrun wrote which the batch set or deleted,
	// and the records that held no key when it was written, up to dropUntil.
	deletes   []string
	dropUntil uint64
}

// write packs the keys a batch set and deleted (the state's own entries left out) into the next
// record, with the fields the commit deletes. The keys are known as the last commit that ended
// left them: the batch before this one may be committing still (Batch.Over), and may hold keys
// that this batch deletes, and so may a record whose commit's end is not known.
func (p *PackedKeys) write(set map[string][]byte, deleted map[string]bool) packedWrite {
	p.mu.Lock()
	defer p.mu.Unlock()
	var w packedWrite
	size := 0
	for k, v := range set {
		if isOwnEntry(k) {
			w.own = put(w.own, k, v)
		} else {
			size += 1 + 2*binary.MaxVarintLen32 + len(k) + len(v)
		}
	}
	// A deletion is recorded only while a record that may set the key is left: one the commit
	// keeps, or one whose commit has not ended well (yet).
	recordDeletes := len(p.records) > 0 || p.next > p.committedUntil
	for k := range deleted {
		switch {
		case isOwnEntry(k):
			w.ownDeleted = append(w.ownDeleted, k)
		case recordDeletes:
			size += 1 + binary.MaxVarintLen32 + len(k)
		}
	}
	if p.oldFields > 0 {
		for k := range set {
			w.deletes = p.oldField(w.deletes, k)
		}
		for k := range deleted {
			w.deletes = p.oldField(w.deletes, k)
		}
	}
	for _, n := range p.dropping {
		w.deletes = append(w.deletes, recordField(n))
		w.dropUntil = n
	}
	if size == 0 {
		return w
	}
	w.value = make([]byte, 0, size)
	for k, v := range set {
		if !isOwnEntry(k) {
			w.value = appendPacked(w.value, '+', k, v)
		}
	}
	if recordDeletes {
		for k := range deleted {
			if !isOwnEntry(k) {
				w.value = appendPacked(w.value, '-', k, nil)
			}
		}
		w.recordsDeletes = true
	}
	p.next++
	w.record = p.next
	return w
}

// oldField appends key to fields when an earlier flowrun wrote it in a field of its own.
func (p *PackedKeys) oldField(fields []string, key string) []string {
	if _, found := p.fields[key]; found && !isOwnEntry(key) {
		fields = append(fields, key)
	}
	return fields
}

// committed takes in what a commit which ended well wrote: its record, the own entries it
// changed, the keys it deleted (those it did not record too), and the records it deleted.
func (p *PackedKeys) committed(w packedWrite, deleted map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, _ := slices.BinarySearch(p.dropping, w.dropUntil+1)
	p.dropping = slices.Delete(p.dropping, 0, i)
	for k, v := range w.own {
		p.fields[k] = v
	}
	for _, k := range w.ownDeleted {
		delete(p.fields, k)
	}
	if w.record > 0 {
		r := &packedRecord{number: w.record, data: w.value}
		p.records = append(p.records, r)
		p.numbered[r.number] = r
		p.committedUntil = w.record
		_ = p.apply(r) // it wrote the record: it reads
	}
	if !w.recordsDeletes {
		for k := range deleted {
			if !isOwnEntry(k) {
				p.deleteKey(k, p.hash(k))
			}
		}
	}
	p.dropDead()
}

// apply sets and deletes the keys of a record, the newest of those applied. It reads the record's
// entries first, and the index's slots for all of them at once (keyIndex.touch), then applies them.
func (p *PackedKeys) apply(r *packedRecord) error {
	p.entries, p.hashes = p.entries[:0], p.hashes[:0]
	for b := r.data; len(b) > 0; {
		offset := len(r.data) - len(b)
		op := b[0]
		if op != '+' && op != '-' {
			return fmt.Errorf("at byte %d: %q is neither '+' nor '-'", offset, op)
		}
		key, rest, err := packedBytes(b[1:])
		if err != nil {
			return fmt.Errorf("at byte %d: %w", offset, err)
		}
		if op == '+' {
			if _, rest, err = packedBytes(rest); err != nil {
				return fmt.Errorf("at byte %d: %w", offset, err)
			}
		}
		p.entries = append(p.entries, packedEntry{key: unsafeString(key), offset: uint32(offset), set: op == '+'})
		p.hashes = append(p.hashes, p.hash(unsafeString(key)))
		b = rest
	}
	p.touched += p.index.touch(p.hashes)
	for i, e := range p.entries {
		if e.set {
			p.setKey(e.key, p.hashes[i], keyAt{record: r.number, offset: e.offset})
		} else {
			p.deleteKey(e.key, p.hashes[i])
		}
	}
	return nil
}

// packedEntry is an entry of a record: a key set (and where) or deleted.
type packedEntry struct {
	key    string
	offset uint32
	set    bool
}

// setKey makes at where key, of hash h, is set.
func (p *PackedKeys) setKey(key string, h uint64, at keyAt) {
	if i, found := p.findHashed(key, h); found {
		p.numbered[p.index.slots[i].at.record].keys--
		p.index.slots[i].at = at
	} else {
		p.index.insert(i, h, at)
	}
	p.numbered[at.record].keys++
	if p.oldFields > 0 {
		if _, found := p.fields[key]; found {
			delete(p.fields, key)
			p.oldFields--
		}
	}
}

// deleteKey forgets key, of hash h, and the record that set it holds one key less.
func (p *PackedKeys) deleteKey(key string, h uint64) {
	if i, found := p.findHashed(key, h); found {
		p.numbered[p.index.slots[i].at.record].keys--
		p.index.remove(i)
	}
	if p.oldFields > 0 {
		if _, found := p.fields[key]; found {
			delete(p.fields, key)
			p.oldFields--
		}
	}
}

// dropDead moves the oldest records that hold no key to dropping: the next commit deletes them.
func (p *PackedKeys) dropDead() {
	i := 0
	for ; i < len(p.records) && p.records[i].keys == 0; i++ {
		p.dropping = append(p.dropping, p.records[i].number)
		delete(p.numbered, p.records[i].number)
	}
	p.records = slices.Delete(p.records, 0, i)
}

// Keys returns each key and its value, the state's own entries left out: what the owner knows.
func (p *PackedKeys) Keys() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, p.index.size()+p.oldFields)
	p.index.each(func(at keyAt) { out[p.keyAt(at)] = string(p.valueAt(at)) })
	for k, v := range p.fields {
		if !isOwnEntry(k) {
			out[k] = string(v)
		}
	}
	return out
}

// recordField is the field of the state hash that holds record n.
func recordField(n uint64) string {
	return redis.PackedKeysField + strconv.FormatUint(n, 10)
}

// appendPacked appends a key set (op '+', with its value) or deleted (op '-') to a record.
func appendPacked(b []byte, op byte, key string, value []byte) []byte {
	b = append(b, op)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	if op == '+' {
		b = binary.AppendUvarint(b, uint64(len(value)))
		b = append(b, value...)
	}
	return b
}

// ReadPackedKeys reads the keys of a stage that packs them from its state hash: every record, the
// fields an earlier flowrun wrote a key each (see above), and the state's own entries.
func ReadPackedKeys(ctx context.Context, store KeyStore, hash string) (*PackedKeys, error) {
	return readPackedKeys(ctx, store, hash, false)
}

func readPackedKeys(ctx context.Context, store KeyStore, hash string, sameHash bool) (*PackedKeys, error) {
	p := newPackedKeys(sameHash)
	var records []*packedRecord
	var cursor uint64
	for {
		entries, next, err := store.ScanState(ctx, hash, cursor, packedScanPage)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			name, packed := strings.CutPrefix(e.Key, redis.PackedKeysField)
			if !packed {
				if _, again := p.fields[e.Key]; !again && !isOwnEntry(e.Key) {
					p.oldFields++
				}
				p.fields[e.Key] = []byte(e.Value)
				continue
			}
			n, err := strconv.ParseUint(name, 10, 64)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("the field %q of %s is no record of keys: its number is not a positive integer", e.Key, hash)
			}
			if p.numbered[n] == nil { // a scan may return a field twice
				r := &packedRecord{number: n, data: []byte(e.Value)}
				p.numbered[n] = r
				records = append(records, r)
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	slices.SortFunc(records, func(a, b *packedRecord) int { return cmp.Compare(a.number, b.number) })
	for _, r := range records {
		p.records = append(p.records, r)
		if err := p.apply(r); err != nil {
			return nil, fmt.Errorf("the record %q of %s: %w", recordField(r.number), hash, err)
		}
		p.next = r.number
	}
	p.committedUntil = p.next
	p.loaded = true
	p.dropDead()
	return p, nil
}

// packedScanPage is how many fields a page of ReadPackedKeys's scan asks for: records are each a
// batch's keys, some tens of kilobytes.
const packedScanPage = 100

// errTruncated says that a record ends within an entry.
var errTruncated = errors.New("it ends within an entry")

// packedBytes reads a length and as many bytes from b, and returns them with what follows.
func packedBytes(b []byte) (_, rest []byte, _ error) {
	n, size := binary.Uvarint(b)
	if size <= 0 || n > uint64(len(b)-size) {
		return nil, nil, errTruncated
	}
	end := size + int(n)
	return b[size:end], b[end:], nil
}

// unsafeString is b as a string, without a copy: b is a record's, which is never written again.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
