package runtime

import (
	"testing"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestReadSharesBoundWhatANodeHoldsInFlight: up to fullBatchUnits units of a node in one process
// each read full batches and ahead, as one unit alone; beyond, all of them together hold in flight
// (a batch each, and one read ahead where they read ahead) no more than one unit does, until each
// reads minReadShare entries. A unit that ends gives its share back.
func TestReadSharesBoundWhatANodeHoldsInFlight(t *testing.T) {
	const readCount = 1000
	n := &node{readCount: readCount}
	var leaves []func()
	for units := 1; units <= 64; units++ {
		leaves = append(leaves, n.reads.join())
		w := &worker{u: &unit{node: n, partition: units - 1}}
		count := w.readArgs(redis.ReadArgs{Count: readCount}).Count
		batches := int64(1)
		if n.reads.ahead() {
			batches = 2
		}
		held := int64(units) * count * batches
		switch {
		case units <= fullBatchUnits:
			if count != readCount || batches != 2 {
				t.Fatalf("%d units: each reads %d entries (ahead: %v), want %d and ahead", units, count, batches == 2, readCount)
			}
		case count < minReadShare:
			t.Fatalf("%d units: each reads %d entries, fewer than %d", units, count, minReadShare)
		case held > max(sharedBatches*readCount, int64(units)*minReadShare):
			t.Fatalf("%d units hold up to %d entries in flight, more than %d full batches", units, held, sharedBatches)
		}
	}
	for _, leave := range leaves[1:] {
		leave()
	}
	if got := n.reads.count(readCount); got != readCount || !n.reads.ahead() {
		t.Fatalf("the last unit left reads %d entries (ahead: %v), want %d and ahead", got, n.reads.ahead(), readCount)
	}
	// A node that reads less at a time (a max_lag downstream) shares what it reads.
	small := &node{}
	for range 8 {
		small.reads.join()
	}
	if got, want := small.reads.count(600), int64(sharedBatches*600/8); got != want {
		t.Fatalf("8 units of a node reading 600 at a time: each reads %d, want %d", got, want)
	}
}
