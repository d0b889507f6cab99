// Package state holds what a stateful stage keeps per input partition, under that partition's
// hash tag: the state writes of a batch, which commit with its acks in one fenced step (Batch), and
// the watermarks a unit follows or measures and passes on to what it writes (Watermarks). Nothing
// is restored when a partition moves: the next owner reads the committed state from Redis.
package state

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Store is what this package reads from Redis: the committed state, timers and holds of a
// partition, and the watermarks of its writers. *redis.Client is one.
type Store interface {
	ReadState(ctx context.Context, hash, key string) ([]byte, bool, error)
	ReadStates(ctx context.Context, hash string, keys []string) ([][]byte, error)
	DueTimers(ctx context.Context, key string, until, count int64) ([]redis.DueTimer, error)
	Holds(ctx context.Context, key string, n int64) ([]redis.DueTimer, error)
	ReadMarks(ctx context.Context, hash, stream string) (map[string]string, string, error)
	Backlog(ctx context.Context, stream string, groups []string) (int64, error)
}

// Keys are the Redis keys of a stateful stage's state on one partition (redis.Keys.State, Timers,
// Holds), all in the partition's slot.
type Keys struct {
	Hash, Timers, Holds string
}

// Batch collects the state writes of one batch of a stateful stage on one partition. Each attempt
// at a message writes into an Attempt of its own; a successful attempt's writes join the batch's,
// and the batch's commit writes them with the acks in one fenced step (Writes). A failed attempt's
// writes are dropped with it; a batch that is not committed (a lost lease, a crash) drops all of
// them, and the partition's next owner processes the batch again from the committed state.
type Batch struct {
	store     Store
	keys      Keys
	partition int
	// held knows which keys the committed state cannot hold: those are not read.
	held *HeldKeys
	// packed holds the keys of a stage that packs them (PackedKeys), nil for another; packedWrite
	// is what the batch's commit writes of them.
	packed      *PackedKeys
	packedWrite packedWrite

	mu      sync.Mutex // the lanes of a batch would write concurrently (the stateful ones do not)
	set     map[string][]byte
	del     map[string]bool
	timerAt map[string]int64
	cancel  map[string]bool
	holdAt  map[string]int64
	release map[string]bool
	// groups are the members of the timers that attempts shared (AddTimerMember), by prefix and
	// time, until they are named (nameGroups) and join timerAt. lastGroup and lastMembers are the
	// group an attempt joined last: the next attempt's member is most often of the same group
	// (a dedupe's keys of the same time), and joins it without a look-up.
	groups      map[timerGroup]*[]string
	lastGroup   timerGroup
	lastMembers *[]string
	// watermark is what the batch commits as the partition's own watermark, in Unix ms (SetWatermark);
	// moved says it changed.
	watermark int64
	moved     bool
	// late and duplicates are the batch's recorded outcomes, counted once it commits.
	late, duplicates int64
	// fetched holds the committed values of the keys read ahead for the batch (Prefetch), nil for
	// a key the state does not hold.
	fetched map[string][]byte
	// spare is an attempt that is done (joined, or failed for good), whose maps the next attempt
	// takes over emptied: an attempt per message would otherwise make its maps afresh, which was
	// a sixth of what an aggregate allocated.
	spare *Attempt
	// committing is the partition's batch before this one while its commit is in flight (Over):
	// Redis may or may not hold its writes yet, so this batch reads them from it, under its own.
	committing *Batch
}

// NewBatch starts the state of a batch on a partition, whose owner knows of its keys what held
// does (nil: nothing), and keeps them all in packed for a stage that packs them (nil for another).
func NewBatch(store Store, keys Keys, partition int, held *HeldKeys, packed *PackedKeys) *Batch {
	return &Batch{store: store, keys: keys, partition: partition, held: held, packed: packed}
}

// Reuse empties a committed batch for the next batch of its partition, keeping its maps' memory:
// made afresh, the values read ahead and the values written were two maps of as many entries as
// the batch has keys, a sixth of the bytes a dedupe allocated. Nothing may hold the batch, or
// what Writes returned, any more.
func (b *Batch) Reuse() *Batch {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.set)
	clear(b.del)
	clear(b.timerAt)
	clear(b.cancel)
	clear(b.holdAt)
	clear(b.release)
	clear(b.groups)
	clear(b.fetched)
	b.lastGroup, b.lastMembers = timerGroup{}, nil
	b.committing = nil
	b.watermark, b.moved = 0, false
	b.late, b.duplicates = 0, 0
	b.packedWrite = packedWrite{}
	return b
}

// Over lays the batch over the partition's batch before it, whose commit is in flight while this
// batch is processed (nil: none is). The commit is one atomic step, so each read of Redis finds
// either none or all of its writes; this batch reads the keys, timers and holds that the batch
// before it wrote from that batch instead, and finds the same either way. The batch before is not
// written any more: its writes are what its commit sends. Called before the batch's first read;
// Settled ends it.
func (b *Batch) Over(committing *Batch) {
	b.committing = committing
}

// Settled ends Over once the batch has read all it reads: the batch before it is then committed,
// or the batch is given up.
func (b *Batch) Settled() {
	if b != nil {
		b.committing = nil
	}
}

// Outcomes are the batch's recorded outcomes: messages found late, and duplicates.
func (b *Batch) Outcomes() (late, duplicates int64) {
	if b == nil {
		return 0, 0
	}
	return b.late, b.duplicates
}

// Prefetch reads the state keys that the batch's messages, or its due timers, will read
// (stages.StatePrefetcher, stages.TimerStatePrefetcher) in one round trip. The partition's lease
// keeps every other process from writing its state, so the values stay committed ones until the
// batch commits its own writes, which Get reads first. A failed read is no error: Get then reads
// each key when it is asked. A key that the partition's owner knows the state cannot hold
// (HeldKeys) is not read, nor one of its own entries that the owner wrote; a stage that packs its
// keys reads none, but takes them from its owner's (PackedKeys). Called while no attempt of the
// batch runs: before its messages, and before each round of its timers.
func (b *Batch) Prefetch(ctx context.Context, keys []string) {
	if b.fetched == nil {
		b.fetched = make(map[string][]byte, len(keys))
	}
	if b.packed != nil {
		b.packed.lookAhead(keys, b.fetched) // its owner holds them all
		return
	}
	// Each key once, and none read ahead already: a batch names a busy group's keys many times.
	// A key goes into fetched as it is taken (a map is cheaper than sorting the names), and out
	// again if the read fails.
	wanted := keys[:0]
	for _, k := range keys {
		if b.committing.wrote(k) {
			continue // read from the batch before (Get)
		}
		if _, ahead := b.fetched[k]; !ahead {
			v, own := b.held.Own(k)
			b.fetched[k] = v
			if !own && !b.held.Absent(k) {
				wanted = append(wanted, k)
			}
		}
	}
	if len(wanted) == 0 {
		return
	}
	if b.set == nil {
		// The keys a batch reads are, mostly, those it writes: made for as many, the batch's map
		// of values does not grow (and copy itself) several times while its attempts join.
		b.set = make(map[string][]byte, len(wanted))
	}
	vals, err := b.store.ReadStates(ctx, b.keys.Hash, wanted)
	for i, k := range wanted {
		if err != nil {
			delete(b.fetched, k)
		} else {
			b.fetched[k] = vals[i]
		}
	}
}

// wrote reports whether the batch set or deleted key; false for a nil batch.
func (b *Batch) wrote(key string) bool {
	if b == nil {
		return false
	}
	_, set := b.set[key]
	return set || b.del[key]
}

// Changes counts the batch's state changes so far: keys set and deleted, timers and holds set and
// removed (a timer group counts as one until it is named).
func (b *Batch) Changes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.set) + len(b.del) + len(b.timerAt) + len(b.cancel) + len(b.holdAt) + len(b.release) + len(b.groups)
}

// SetWatermark makes the batch commit the partition's own watermark (redis.WatermarkField).
func (b *Batch) SetWatermark(at int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.watermark, b.moved = at, true
}

// Writes are the batch's state changes for its commit; nil when it changed nothing.
func (b *Batch) Writes() *redis.StateWrites {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nameGroups()
	if len(b.set)+len(b.del)+len(b.timerAt)+len(b.cancel)+len(b.holdAt)+len(b.release) == 0 && !b.moved {
		return nil
	}
	w := &redis.StateWrites{Key: b.keys.Hash, TimersKey: b.keys.Timers, HoldsKey: b.keys.Holds, Set: b.set,
		Timers: b.timerAt, Holds: b.holdAt}
	if b.packed != nil {
		b.pack(w)
	} else {
		for k := range b.del {
			w.Delete = append(w.Delete, k)
		}
	}
	if b.moved {
		w.Set = put(w.Set, redis.WatermarkField, []byte(strconv.FormatInt(b.watermark, 10)))
	}
	for k := range b.cancel {
		w.Cancel = append(w.Cancel, k)
	}
	for k := range b.release {
		w.Release = append(w.Release, k)
	}
	return w
}

// pack makes w's keys set and deleted those of a stage that packs its keys: the keys go into a
// record, and the state's own entries into fields, as for another stage. b.set keeps them all: the
// batch after this one reads them there while this one commits (Over).
func (b *Batch) pack(w *redis.StateWrites) {
	b.packedWrite = b.packed.write(b.set, b.del)
	w.Set = map[string][]byte{}
	for k, v := range b.set {
		if isOwnEntry(k) {
			w.Set[k] = v
		}
	}
	if b.packedWrite.record > 0 {
		w.Set[recordField(b.packedWrite.record)] = b.packedWrite.value
	}
	for k := range b.del {
		if isOwnEntry(k) {
			w.Delete = append(w.Delete, k)
		}
	}
	w.Delete = append(w.Delete, b.packedWrite.deletes...)
}

// Committed tells the batch that its commit ended well: the owner's packed keys take in what it
// wrote (PackedKeys). Nothing for a stage that does not pack its keys.
func (b *Batch) Committed() {
	if b == nil || b.packed == nil {
		return
	}
	b.packed.committed(b.packedWrite, b.del)
}

// LoadWatermark reads the partition's own watermark as committed (redis.WatermarkField), in Unix
// ms; 0 when it has none.
func LoadWatermark(ctx context.Context, store Store, hash string) (int64, error) {
	v, found, err := store.ReadState(ctx, hash, redis.WatermarkField)
	if err != nil {
		if !redis.Unrecoverable(err) {
			err = stages.Transient(err)
		}
		return 0, err
	}
	if !found {
		return 0, nil
	}
	wm, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the watermark in %s is %q, not a time in Unix ms", hash, v)
	}
	return wm, nil
}

// DueTimers returns up to count of the timers due at wm, as the batch sees them: those committed,
// less those the batch (or the batch before, Over) cancelled, moved or fired already, with those
// they set; earliest first.
func (b *Batch) DueTimers(ctx context.Context, wm, count int64, fired map[string]bool) ([]redis.DueTimer, error) {
	// The committed timers that the batches have changed or fired are still in Redis, and may be
	// the earliest: the first count that they have not are among the first count + changed + fired.
	b.mu.Lock()
	b.nameGroups()
	before := b.committing
	changed := int64(len(b.timerAt) + len(b.cancel) + len(fired))
	if before != nil {
		changed += int64(len(before.timerAt) + len(before.cancel))
	}
	b.mu.Unlock()
	committed, err := b.store.DueTimers(ctx, b.keys.Timers, wm, count+changed)
	if err != nil {
		if !redis.Unrecoverable(err) {
			err = stages.Transient(err)
		}
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	changedHere := func(name string) bool {
		_, moved := b.timerAt[name]
		return moved || b.cancel[name] || fired[name]
	}
	var due []redis.DueTimer
	for _, t := range committed {
		if !changedHere(t.Name) && !before.changedTimer(t.Name) {
			due = append(due, t)
		}
	}
	if before != nil {
		for name, at := range before.timerAt {
			if at <= wm && !changedHere(name) {
				due = append(due, redis.DueTimer{Name: name, At: at})
			}
		}
	}
	for name, at := range b.timerAt {
		if at <= wm && !fired[name] {
			due = append(due, redis.DueTimer{Name: name, At: at})
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if due[i].At != due[j].At {
			return due[i].At < due[j].At
		}
		return due[i].Name < due[j].Name
	})
	if int64(len(due)) > count {
		due = due[:count]
	}
	return due, nil
}

// changedTimer reports whether the batch set or cancelled the timer name; false for a nil batch.
func (b *Batch) changedTimer(name string) bool {
	if b == nil {
		return false
	}
	_, set := b.timerAt[name]
	return set || b.cancel[name]
}

// MinHold returns the earliest hold of the partition as the batch leaves it (committed holds, less
// those it or the batch before it, Over, released or moved, with those they set), and false when
// there is none.
func (b *Batch) MinHold(ctx context.Context) (int64, bool, error) {
	b.mu.Lock()
	before := b.committing
	changed := int64(len(b.holdAt) + len(b.release))
	least, found := int64(0), false
	for _, at := range b.holdAt {
		if !found || at < least {
			least, found = at, true
		}
	}
	if before != nil {
		changed += int64(len(before.holdAt) + len(before.release))
		for name, at := range before.holdAt {
			if _, moved := b.holdAt[name]; !moved && !b.release[name] && (!found || at < least) {
				least, found = at, true
			}
		}
	}
	b.mu.Unlock()
	// The first committed hold that the batches left alone is among the first changed+1.
	committed, err := b.store.Holds(ctx, b.keys.Holds, changed+1)
	if err != nil {
		if !redis.Unrecoverable(err) {
			err = stages.Transient(err)
		}
		return 0, false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range committed {
		if _, moved := b.holdAt[h.Name]; moved || b.release[h.Name] || before.changedHold(h.Name) {
			continue
		}
		if !found || h.At < least {
			least, found = h.At, true
		}
		break
	}
	return least, found, nil
}

// changedHold reports whether the batch set or released the hold name; false for a nil batch.
func (b *Batch) changedHold(name string) bool {
	if b == nil {
		return false
	}
	_, set := b.holdAt[name]
	return set || b.release[name]
}

// Attempt is one attempt's view of its batch's state: the stages.State that a stateful kind gets
// with a message (or a timer).
type Attempt struct {
	batch   *Batch
	set     map[string][]byte
	del     map[string]bool
	timerAt map[string]int64
	cancel  map[string]bool
	holdAt  map[string]int64
	release map[string]bool
	members []groupMember // AddTimerMember's
	// values holds the copies of the small values the attempt puts (keep), many to an
	// allocation: a copy of its own for each was two allocations per message of a dedupe (the
	// key's first time, and the count of keys).
	// The attempt is reused through its batch (spare), and the room already taken is never
	// written again, so the values joined to the batch stay as they were put.
	values []byte
	// watermark is the partition's watermark as of the attempt's message, in Unix ms.
	watermark int64
	// late and duplicates count the attempt's Record calls.
	late, duplicates int64
}

// Attempt starts an attempt at a message whose partition's watermark is watermark (Unix ms).
func (b *Batch) Attempt(watermark int64) *Attempt {
	b.mu.Lock()
	a := b.spare
	b.spare = nil
	b.mu.Unlock()
	if a == nil {
		return &Attempt{batch: b, watermark: watermark}
	}
	a.watermark = watermark
	return a
}

// Join adds a successful attempt's writes to its batch, and its outcomes. The attempt is done:
// the batch's next attempt may reuse it.
func (a *Attempt) Join() {
	b := a.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	b.set, b.del = overlay(b.set, b.del, a.set, a.del)
	b.timerAt, b.cancel = overlay(b.timerAt, b.cancel, a.timerAt, a.cancel)
	b.holdAt, b.release = overlay(b.holdAt, b.release, a.holdAt, a.release)
	for _, m := range a.members {
		if b.lastMembers == nil || m.timerGroup != b.lastGroup {
			b.lastGroup, b.lastMembers = m.timerGroup, b.membersOf(m.timerGroup)
		}
		*b.lastMembers = append(*b.lastMembers, m.member)
	}
	b.late, b.duplicates = b.late+a.late, b.duplicates+a.duplicates
	b.spare = a.emptied()
}

// membersOf returns the members of a group so far, which the group's new members join.
func (b *Batch) membersOf(g timerGroup) *[]string {
	if members := b.groups[g]; members != nil {
		return members
	}
	if b.groups == nil {
		b.groups = map[timerGroup]*[]string{}
	}
	members := new([]string)
	b.groups[g] = members
	return members
}

// timerGroup is the prefix and time (Unix ms) of the timer that members share (AddTimerMember).
type timerGroup struct {
	prefix string
	at     int64
}

// groupMember is an attempt's member of a timer group.
type groupMember struct {
	timerGroup
	member string
}

// nameGroups makes the timer groups of the batch's attempts so far timers: each group's members,
// sorted and each once, name its timer (stages.TimerGroupName). A group of one member is named
// prefix+member, as SetTimer would name the member's own timer (moving a timer of that name from
// an earlier batch, which the member no longer needs), unless another group of the batch is of
// that member alone: a member added again at another time has a timer at each (the kind's
// OnTimer finds out which it is due at), not one that the last group to be named would move. A
// member added after that, by a timer of the batch, makes a timer of its own group. Called with
// b.mu held, before the batch's timers are read (DueTimers) or written (Writes).
func (b *Batch) nameGroups() {
	if len(b.groups) == 0 {
		return
	}
	alone := map[string]int{} // prefix+member: the groups of that member alone
	for g, p := range b.groups {
		slices.Sort(*p)
		*p = slices.Compact(*p)
		if members := *p; len(members) == 1 {
			alone[g.prefix+members[0]]++
		}
	}
	for g, p := range b.groups {
		members := *p
		name := ""
		if len(members) == 1 && !strings.HasPrefix(members[0], "\x00") {
			name = g.prefix + members[0]
			if at, set := b.timerAt[name]; alone[name] > 1 || set && at != g.at {
				name = ""
			}
		}
		if name == "" {
			name = stages.TimerGroupName(g.prefix, g.at, members)
		}
		b.timerAt = put(b.timerAt, name, g.at)
		delete(b.cancel, name)
	}
	clear(b.groups)
	b.lastMembers = nil
}

// emptied returns the attempt with no writes and no outcomes, for the next attempt of its batch.
func (a *Attempt) emptied() *Attempt {
	a.set, a.del = empty(a.set), empty(a.del)
	a.timerAt, a.cancel = empty(a.timerAt), empty(a.cancel)
	a.holdAt, a.release = empty(a.holdAt), empty(a.release)
	a.members = a.members[:0]
	if cap(a.members) > 64 {
		a.members = nil
	}
	a.late, a.duplicates = 0, 0
	return a
}

// empty empties a map of an attempt for reuse; a large one is dropped instead, as clearing it
// would cost every later attempt as much as it holds.
func empty[V any](m map[string]V) map[string]V {
	switch {
	case len(m) == 0: // most attempts write a kind or two of change: the others are empty already
		return m
	case len(m) > 64:
		return nil
	}
	clear(m)
	return m
}

// overlay lays an attempt's writes of one kind (values set, keys removed) over the batch's: a
// value set undoes an earlier removal of its key, a removal an earlier value.
func overlay[V any](set map[string]V, removed map[string]bool, moreSet map[string]V, moreRemoved map[string]bool) (map[string]V, map[string]bool) {
	if len(moreSet) == 0 && len(moreRemoved) == 0 {
		return set, removed // ranging over empty maps is not free, and most kinds of change are
	}
	for k, v := range moreSet {
		set = put(set, k, v)
		delete(removed, k)
	}
	for k := range moreRemoved {
		delete(set, k)
		removed = put(removed, k, true)
	}
	return set, removed
}

// Failed counts the outcomes of an attempt that failed for good (its message is dead-lettered),
// without its writes: a late message dead-lettered counts as late.
func (a *Attempt) Failed() {
	b := a.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	b.late, b.duplicates = b.late+a.late, b.duplicates+a.duplicates
	b.spare = a.emptied()
}

// Recorded reports whether the attempt recorded an outcome (late, duplicate).
func (a *Attempt) Recorded() bool { return a.late+a.duplicates > 0 }

// RecordedLate reports whether the attempt recorded its message late.
func (a *Attempt) RecordedLate() bool { return a.late > 0 }

func (a *Attempt) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if v, ok := a.set[key]; ok {
		return v, true, nil
	}
	if a.del[key] {
		return nil, false, nil
	}
	b := a.batch
	b.mu.Lock()
	v, set := b.set[key]
	deleted := b.del[key]
	b.mu.Unlock()
	ahead, fetched := b.fetched[key] // written only before the batch's attempts begin
	switch {
	case set:
		return v, true, nil
	case deleted:
		return nil, false, nil
	case b.committing.wrote(key):
		v, set := b.committing.set[key]
		return v, set, nil
	case fetched:
		return ahead, ahead != nil, nil
	case b.packed != nil:
		v, found := b.packed.get(key)
		return v, found, nil
	}
	if v, own := b.held.Own(key); own {
		return v, true, nil
	}
	if b.held.Absent(key) {
		return nil, false, nil
	}
	v, found, err := b.store.ReadState(ctx, b.keys.Hash, key)
	if err != nil && !redis.Unrecoverable(err) {
		// Redis is away: the node pauses and tries again, as for a downstream service, rather than
		// spending the message's attempts (or dead-lettering it) on an outage.
		err = stages.Transient(err)
	}
	return v, found, err
}

// checkKey refuses the keys of the runtime's own fields of the state hash: a kind, or a Go function
// keyed by what its messages say, that wrote one would corrupt the partition's watermark.
func checkKey(key string) error {
	if key == redis.WatermarkField {
		return stages.Permanent(fmt.Errorf("the state key %q is a field of the runtime's own", key))
	}
	return nil
}

func (a *Attempt) Put(_ context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	a.set = put(a.set, key, a.keep(value))
	delete(a.del, key)
	return nil
}

// The values a Put copies into the attempt's shared memory (values): the small ones, a chunk of
// them at a time. A large value takes an allocation of its own, so that a value kept in the
// batch keeps no more than its neighbours of a chunk alive.
const (
	sharedValueMax = 256
	valueChunk     = 4096
)

// keep returns a copy of value that the caller's later changes to value do not reach.
func (a *Attempt) keep(value []byte) []byte {
	n := len(value)
	if n == 0 || n > sharedValueMax {
		return append([]byte(nil), value...) // nil for an empty value, as it always was
	}
	if cap(a.values)-len(a.values) < n {
		a.values = make([]byte, 0, valueChunk)
	}
	start := len(a.values)
	a.values = append(a.values, value...)
	// Capped, so that appending to the copy moves it rather than writing over the next value.
	return a.values[start : start+n : start+n]
}

func (a *Attempt) Delete(_ context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	delete(a.set, key)
	a.del = put(a.del, key, true)
	return nil
}

func (a *Attempt) SetTimer(_ context.Context, name string, at time.Time) error {
	a.timerAt = put(a.timerAt, name, at.UnixMilli())
	delete(a.cancel, name)
	return nil
}

// AddTimerMember adds member to the timer of prefix due at at, which the members that the batch's
// attempts add with the same prefix and time share (stages.TimerGrouper).
func (a *Attempt) AddTimerMember(_ context.Context, prefix string, at time.Time, member string) error {
	a.members = append(a.members, groupMember{timerGroup{prefix, at.UnixMilli()}, member})
	return nil
}

func (a *Attempt) CancelTimer(_ context.Context, name string) error {
	delete(a.timerAt, name)
	a.cancel = put(a.cancel, name, true)
	return nil
}

func (a *Attempt) Hold(_ context.Context, name string, at time.Time) error {
	a.holdAt = put(a.holdAt, name, at.UnixMilli())
	delete(a.release, name)
	return nil
}

func (a *Attempt) Release(_ context.Context, name string) error {
	delete(a.holdAt, name)
	a.release = put(a.release, name, true)
	return nil
}

func (a *Attempt) Watermark(context.Context) (time.Time, error) {
	if a.watermark <= 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(a.watermark), nil
}

func (a *Attempt) Record(o stages.Outcome) {
	switch o {
	case stages.Late:
		a.late++
	case stages.Duplicate:
		a.duplicates++
	}
}

func (a *Attempt) Partition() int { return a.batch.partition }

var (
	_ stages.State        = (*Attempt)(nil)
	_ stages.TimerGrouper = (*Attempt)(nil)
)

func put[V any](m map[string]V, k string, v V) map[string]V {
	if m == nil {
		m = map[string]V{}
	}
	m[k] = v
	return m
}
