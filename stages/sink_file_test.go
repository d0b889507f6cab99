package stages

import (
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
)

// waitWritten waits until n flushes have said that their writes are done.
func waitWritten(g *groupSync, n uint64) {
	for g.written.Load() < n {
		runtime.Gosched()
	}
}

// TestGroupSyncSharesASyncAmongItsWaiters: two batches written while another batch's sync runs
// are not covered by that sync, which started before their writes, but share the next one.
func TestGroupSyncSharesASyncAmongItsWaiters(t *testing.T) {
	var g groupSync
	var syncs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error)
	go func() {
		first <- g.sync(func() error { syncs.Add(1); close(started); <-release; return nil })
	}()
	<-started
	later := make(chan error, 2)
	for range 2 {
		go func() { later <- g.sync(func() error { syncs.Add(1); return nil }) }()
	}
	waitWritten(&g, 3) // both written, waiting for the first sync
	close(release)
	for _, c := range []chan error{first, later, later} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if n := syncs.Load(); n != 2 {
		t.Fatalf("%d syncs, want 2: the first batch's and one for both later ones", n)
	}
}

// TestGroupSyncFailedSyncCoversNothing: a failed sync makes nothing durable, so a batch that it
// would have covered syncs again.
func TestGroupSyncFailedSyncCoversNothing(t *testing.T) {
	var g groupSync
	var syncs atomic.Int32
	syncFile := func() error {
		if syncs.Add(1) == 1 {
			return errors.New("input/output error")
		}
		return nil
	}
	g.mu.Lock() // both batches written before either sync starts
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- g.sync(syncFile) }()
	}
	waitWritten(&g, 2)
	g.mu.Unlock()
	failed := 0
	for range 2 {
		if err := <-done; err != nil {
			failed++
		}
	}
	if failed != 1 || syncs.Load() != 2 {
		t.Fatalf("%d failed after %d syncs, want 1 after 2", failed, syncs.Load())
	}
}
