package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestKnownAbsentKeysAreNotRead: once the keys of the state are loaded, a batch reads ahead only
// the keys the state may hold; a key it cannot hold is missing without a read, ahead or asked for.
func TestKnownAbsentKeysAreNotRead(t *testing.T) {
	srv, c := open(t)
	ctx := context.Background()
	if err := c.Universal().HSet(ctx, "state", "a", "1", "b", "2").Err(); err != nil {
		t.Fatal(err)
	}
	held := NewHeldKeys()
	if !held.Wants() {
		t.Fatal("a new lease's keys are not loaded, yet no load is wanted")
	}
	if err := held.Load(ctx, c, "state"); err != nil {
		t.Fatal(err)
	}
	if held.Wants() {
		t.Fatal("loaded keys want loading again")
	}

	b := NewBatch(c, Keys{Hash: "state"}, 0, held, nil)
	before := srv.CommandCount()
	b.Prefetch(ctx, []string{"x", "y"})
	if n := srv.CommandCount() - before; n != 0 {
		t.Fatalf("reading ahead keys the state cannot hold sent %d commands, want none", n)
	}
	b.Prefetch(ctx, []string{"a", "z"})
	if n := srv.CommandCount() - before; n != 1 {
		t.Fatalf("reading ahead a key the state holds sent %d commands, want 1", n)
	}
	a := b.Attempt(0)
	for key, want := range map[string]string{"a": "1", "b": "2"} {
		v, found, err := a.Get(ctx, key)
		if err != nil || !found || string(v) != want {
			t.Fatalf("Get(%s) = %q, %v, %v; want %q: a key the state holds is read", key, v, found, err, want)
		}
	}
	before = srv.CommandCount()
	for _, key := range []string{"x", "q"} {
		if _, found, err := a.Get(ctx, key); err != nil || found {
			t.Fatalf("Get(%s) = found %v, %v; want missing", key, found, err)
		}
	}
	if n := srv.CommandCount() - before; n != 0 {
		t.Fatalf("asking for keys the state cannot hold sent %d commands, want none", n)
	}

	// The state's own entries that the owner committed are known, and not read either; until
	// a commit of unknown outcome.
	count := "\x00keys"
	held.Committed(map[string][]byte{count: []byte("2")}, nil)
	b = NewBatch(c, Keys{Hash: "state"}, 0, held, nil)
	before = srv.CommandCount()
	b.Prefetch(ctx, []string{count})
	if v, found, err := b.Attempt(0).Get(ctx, count); err != nil || !found || string(v) != "2" {
		t.Fatalf("the count the owner committed reads %q, %v, %v; want 2", v, found, err)
	}
	if n := srv.CommandCount() - before; n != 0 {
		t.Fatalf("reading an own entry the owner committed sent %d commands, want none", n)
	}
	held.Forget()
	if _, known := held.Own(count); known {
		t.Fatal("an own entry is known after Forget")
	}
}

// TestHeldKeysNeverMissAKeyTheStateHolds: whatever the state held before the lease, whatever the
// owner's commits set while its keys load and after, and however many, a key the state may hold is
// never said to be absent; what a commit of unknown outcome may have set is not known absent
// either.
func TestHeldKeysNeverMissAKeyTheStateHolds(t *testing.T) {
	ctx := context.Background()
	store := &pagedKeys{keys: keyNames("old", 5000)}
	held := NewHeldKeys()
	// commit is a commit that ended well: the hash holds its keys, and the owner adds them.
	commit := func(keys []string) {
		store.keys = append(store.keys, keys...)
		held.Committed(setOf(keys), nil)
	}
	if !held.Wants() {
		t.Fatal("no load wanted at the start")
	}
	// A commit during the load, between its pages, sets keys that its scan may have passed.
	store.between = func(page int) {
		if page == 2 {
			commit(keyNames("during", 100))
		}
	}
	if err := held.Load(ctx, store, "h"); err != nil {
		t.Fatal(err)
	}
	mustHold(t, held, keyNames("old", 5000), keyNames("during", 100))
	if !held.Absent("never") {
		t.Fatal("a key never set is not known to be absent")
	}

	// Once three times more keys were deleted than are left, a new set loads while the stale one
	// still answers.
	after := keyNames("after", 21_000)
	commit(after)
	gone, after := after[:20_000], after[20_000:]
	store.keys = slices.DeleteFunc(store.keys, func(k string) bool { return strings.HasPrefix(k, "after") })
	store.keys = append(store.keys, after...)
	held.Committed(nil, gone)
	stale := held.known
	if !held.Wants() {
		t.Fatal("a stale set wants no new one")
	}
	var reload []string
	store.between = func(page int) {
		if held.known != stale {
			t.Error("the stale set was dropped before its successor was loaded")
		}
		k := fmt.Sprintf("reload%d", page)
		commit([]string{k})
		reload = append(reload, k)
	}
	if err := held.Load(ctx, store, "h"); err != nil {
		t.Fatal(err)
	}
	if held.known == stale || held.Wants() {
		t.Fatal("the stale set was not replaced")
	}
	if len(reload) == 0 {
		t.Fatal("no commit came during the load")
	}
	mustHold(t, held, keyNames("old", 5000), keyNames("during", 100), after, reload)
	if absent := len(slices.DeleteFunc(slices.Clone(gone), held.Absent)); absent != 0 {
		t.Fatalf("%d of the keys deleted before the load may be in the state, want none", absent)
	}

	// A commit whose outcome is unknown: nothing is known absent until a load.
	held.Forget()
	if held.Absent("never") {
		t.Fatal("after Forget, a key is still known to be absent")
	}
	// A load that a Forget interrupts does not install what it read.
	if !held.Wants() {
		t.Fatal("no load wanted after Forget")
	}
	store.between = func(page int) {
		if page == 1 {
			held.Forget()
		}
	}
	if err := held.Load(ctx, store, "h"); err != nil {
		t.Fatal(err)
	}
	if held.Absent("never") {
		t.Fatal("a load interrupted by Forget was installed")
	}
	// A failed load leaves nothing known, and is wanted again.
	if !held.Wants() {
		t.Fatal("no load wanted after an interrupted one")
	}
	store.between, store.fail = nil, errors.New("connection reset")
	if err := held.Load(ctx, store, "h"); err == nil {
		t.Fatal("a failed scan was not reported")
	}
	if held.Absent("never") || !held.Wants() {
		t.Fatal("a failed load was installed, or not wanted again")
	}
}

func mustHold(t *testing.T, held *HeldKeys, sets ...[]string) {
	t.Helper()
	for _, keys := range sets {
		for _, k := range keys {
			if held.Absent(k) {
				t.Fatalf("key %q may be in the state, and is said to be absent", k)
			}
		}
	}
}

func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint(prefix, i)
	}
	return keys
}

func setOf(keys []string) map[string][]byte {
	set := make(map[string][]byte, len(keys))
	for _, k := range keys {
		set[k] = []byte("1")
	}
	return set
}

// pagedKeys is a state hash whose keys a scan returns a thousand at a time, calling between
// before each page after the first. A scan returns the keys the hash held when it began: those
// added meanwhile are missed, as HSCAN may miss them.
type pagedKeys struct {
	keys     []string
	between  func(page int)
	fail     error
	scanning []string
}

func (s *pagedKeys) ScanState(_ context.Context, _ string, cursor uint64, count int64) ([]redis.StateEntry, uint64, error) {
	if s.fail != nil {
		return nil, 0, s.fail
	}
	if cursor == 0 {
		s.scanning = slices.Clone(s.keys)
	}
	if cursor > 0 && s.between != nil {
		s.between(int(cursor / uint64(count)))
	}
	end := min(cursor+uint64(count), uint64(len(s.scanning)))
	next := end
	if end == uint64(len(s.scanning)) {
		next = 0
	}
	var page []redis.StateEntry
	for _, k := range s.scanning[cursor:end] {
		page = append(page, redis.StateEntry{Key: k})
	}
	return page, next, nil
}

// TestKeySetHasWhatWasAdded: the table of hashes has every hash added (0 included) as it grows,
// and none other.
func TestKeySetHasWhatWasAdded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	added := []uint64{0, 1, 1 << 63}
	for range 100_000 {
		added = append(added, rng.Uint64())
	}
	f := newKeySet(10)
	for _, fp := range added {
		f.add(fp)
		f.add(fp) // twice: still one
	}
	if f.n != len(added)-1 { // 0 is kept as 1
		t.Fatalf("the set holds %d hashes, want %d", f.n, len(added)-1)
	}
	for _, fp := range added {
		if !f.has(fp) {
			t.Fatalf("hash %d was added and is not in the set", fp)
		}
	}
	for range 100_000 {
		if fp := rng.Uint64(); f.has(fp) && !slices.Contains(added, fp) {
			t.Fatalf("hash %d was never added and is in the set", fp)
		}
	}
	if slots := len(f.slots); 4*f.n > 3*slots || 8*f.n < 3*slots {
		t.Fatalf("%d hashes in %d slots: the table is not kept between three eighths and three quarters full", f.n, slots)
	}
}
