package runtime

import "sync/atomic"

// How much a node reads at a time in one process. A read takes up to the node's readCount entries,
// and a unit holds up to two batches: the one it processes and commits, and the one it reads
// meanwhile (worker.processReadingAhead). Every entry in flight costs memory: its reply, its
// message, what it decodes to and its outputs, a few kilobytes for a payload of 200 bytes; and the
// heap grows to five times what is live (GOGC=400, cmd.Main). A process running many partitions of
// a node with a backlog held that for each: 64 partitions, 128,000 entries, 400-600 MB of peak RSS,
// where a few batches already keep two cores and Redis busy.
//
// So up to fullBatchUnits units of a node in one process each read readCount entries and read
// ahead, as one unit alone does. Beyond, the units share sharedBatches full batches, what one unit
// holds: each reads an equal share (never fewer than minReadShare entries, nor more than readCount)
// and reads its next batch once it has committed the last, the units' turns overlapping one
// another as reading ahead overlapped one unit's. What a node holds in flight then stops growing
// with its partitions: with more than fullBatchUnits units, no more than one unit holds (until
// each is down to minReadShare, past sharedBatches*readCount/minReadShare units).
const (
	fullBatchUnits = 4
	sharedBatches  = 2
	minReadShare   = 100
)

// readShares counts a node's units that this process runs, to share its reads among them.
type readShares struct {
	units atomic.Int64
}

// join counts a unit in, and returns the function that counts it out.
func (s *readShares) join() (leave func()) {
	s.units.Add(1)
	return func() { s.units.Add(-1) }
}

// count returns how many entries a read of one of the units takes, of at most readCount.
func (s *readShares) count(readCount int64) int64 {
	units := s.units.Load()
	if units <= fullBatchUnits {
		return readCount
	}
	return min(readCount, max(minReadShare, sharedBatches*readCount/units))
}

// ahead reports whether a unit reads its next batch while it commits the last.
func (s *readShares) ahead() bool { return s.units.Load() <= fullBatchUnits }
