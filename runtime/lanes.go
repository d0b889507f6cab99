package runtime

import (
	goruntime "runtime"
	"slices"

	"github.com/sourcegraph/conc"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// processAll processes a batch. Nodes that keep strict partition order or keep state take the
// messages one after another: a stateful stage's watermark moves with each message in the
// partition's order, so that what it decides (a key forgotten, an event late) does not depend on
// how lanes interleave. So do stages that only compute (inline), but for a large batch, which they
// split in contiguous parts, one per core (computeParts). Others spread them over lanes that run
// in parallel: with ordering "key" all messages of a key share a lane (unkeyed messages share lane
// 0), so each key keeps its order; with "none" messages go to the lanes in turn. Results come back
// in input order, and the commit writes the outputs in that order.
//
// When shutdown abandons a message, the rest of its lane is abandoned too: acking a later message of
// the same key while an earlier one waits for redelivery would reorder the key. A part is followed
// by the later parts, which may hold the same keys: they are abandoned from there on as well.
//
// mem is the memory of the unit's batch before, which this one reuses (nil: none); the results are
// in it, and are the caller's until its next call.
func (r *processing) processAll(n *node, msgs []*message, p pass, mem *laneMemory) []result {
	if mem == nil {
		mem = &laneMemory{}
	}
	results := mem.resultsFor(len(msgs))
	if parts := computeParts(n, len(msgs)); parts > 1 {
		r.processParts(n, msgs, contiguous(mem.allIndexes(len(msgs)), parts), results, p, mem)
		return results
	}
	if n.inline || n.stateful || n.lanes <= 1 || n.ordering == flow.OrderByPartition || len(msgs) == 1 {
		r.processLane(n, msgs, mem.allIndexes(len(msgs)), results, p, mem.lane(0))
		return results
	}
	lanes := make([][]int, n.lanes)
	for i, m := range msgs {
		lane := 0
		switch {
		case n.ordering == flow.OrderNone:
			lane = i % n.lanes
		case m.msg.Key != "":
			lane = laneOf(m.msg.Key, n.lanes)
		}
		lanes[lane] = append(lanes[lane], i)
	}
	lanes = slices.DeleteFunc(lanes, func(lane []int) bool { return len(lane) == 0 })
	bufs := mem.lanes(len(lanes))
	r.inParallel(len(lanes), func(k int) { r.processLane(n, msgs, lanes[k], results, p, bufs[k]) })
	return results
}

// laneMemory is the memory of a unit's last batch's results, indexes and lane outputs, which its
// next batch reuses: made afresh, the results and the outputs were a third of the bytes a hop
// allocated. By the next batch, the worker has copied what it needs of them (its commit's
// outputs); each is emptied as it is reused, so that it keeps no older payload alive than the last
// batch's (as the messages' memory, batchMemory).
type laneMemory struct {
	results []result
	indexes []int
	outs    []*[]redis.Output // a lane's or part's outputs, as the last batch left them
}

// resultsFor returns n empty results.
func (m *laneMemory) resultsFor(n int) []result {
	clear(m.results)
	if cap(m.results) < n {
		m.results = make([]result, n)
	}
	m.results = m.results[:n]
	return m.results
}

// allIndexes returns the indexes [0, n).
func (m *laneMemory) allIndexes(n int) []int {
	if len(m.indexes) < n {
		m.indexes = make([]int, n)
		for i := range m.indexes {
			m.indexes[i] = i
		}
	}
	return m.indexes[:n]
}

// lane returns the outputs buffer of lane (or part) k, emptied.
func (m *laneMemory) lane(k int) *[]redis.Output {
	for len(m.outs) <= k {
		m.outs = append(m.outs, new([]redis.Output))
	}
	buf := m.outs[k]
	clear(*buf)
	*buf = (*buf)[:0]
	return buf
}

// lanes returns the outputs buffers of lanes 0 to count-1, emptied.
func (m *laneMemory) lanes(count int) []*[]redis.Output {
	for k := range count {
		m.lane(k)
	}
	return m.outs[:count]
}

// minPart is the fewest messages of a part of an inline stage's batch (computeParts): below it, a
// goroutine's start and the wait for it are a noticeable share of the part's work.
const minPart = 256

// computeParts returns how many parts an inline stage's batch of count messages is processed in at
// once: one per core the process may use, each of at least minPart messages. Processing such a
// stage's messages in another order than the batch's changes nothing outside (it only computes, and
// what it makes is committed in the batch's order), and on one partition the reading goroutine is
// otherwise all the stage gets of the machine. A stage that keeps strict partition order, keeps
// state, or is a sink (which delivers in order) takes its batch in one part.
func computeParts(n *node, count int) int {
	if !n.inline || n.stateful || n.typ != "stage" || n.ordering == flow.OrderByPartition {
		return 1
	}
	return max(1, min(goruntime.GOMAXPROCS(0), count/minPart))
}

// contiguous splits the indexes all, [0, len(all)), in parts runs of (nearly) equal length, in order.
func contiguous(all []int, parts int) [][]int {
	count := len(all)
	out := make([][]int, parts)
	for i := range out {
		out[i] = all[i*count/parts : (i+1)*count/parts]
	}
	return out
}

// processParts processes the contiguous parts of a batch at once. When shutdown abandons a message,
// every later one is abandoned, in its part and in the parts after it, which may hold its keys:
// those parts' messages are then delivered again after the restart, and so counted then, not now.
// A fused chain counts each part apart (pass.counts) for that reason, and the parts up to the one
// that was cut short are added to the batch's counts.
func (r *processing) processParts(n *node, msgs []*message, parts [][]int, results []result, p pass, mem *laneMemory) {
	counted := make([]*batchCounts, len(parts))
	bufs := mem.lanes(len(parts))
	r.inParallel(len(parts), func(k int) {
		pk := p
		if p.counts != nil {
			pk.counts = &batchCounts{nodes: make([]counts, len(p.counts.nodes))}
			counted[k] = pk.counts
		}
		r.processLane(n, msgs, parts[k], results, pk, bufs[k])
	})
	for k, part := range parts {
		if counted[k] != nil {
			p.counts.addChain(counted[k].nodes)
		}
		if results[part[len(part)-1]].abandoned { // processLane abandons the rest of a part
			for _, later := range parts[k+1:] {
				for _, i := range later {
					results[i] = result{abandoned: true}
				}
			}
			return
		}
	}
}

// inParallel runs f(0) ... f(count-1) each in a goroutine of its own, and waits for them all.
func (r *processing) inParallel(count int, f func(k int)) {
	// Each goroutine is at work in its own right; the caller's waits for them (Activity).
	var wg conc.WaitGroup
	for k := range count {
		r.activity.add(1)
		wg.Go(func() {
			defer r.activity.add(-1)
			f(k)
		})
	}
	done := r.activity.waiting()
	wg.Wait()
	done()
}

// processLane processes the messages at the given indexes in order; their outputs share one buffer,
// mem (empty), which it leaves holding them.
func (r *processing) processLane(n *node, msgs []*message, indexes []int, results []result, p pass, mem *[]redis.Output) {
	p.measured = r.measuring()
	defer r.record(p.measured)
	buf := *mem
	if want := n.outputsPer(len(indexes)); cap(buf) < want {
		buf = make([]redis.Output, 0, want)
	}
	defer func() { *mem = buf }()
	for k, i := range indexes {
		results[i], buf = r.processMessage(n, msgs[i], buf, p)
		if results[i].abandoned {
			for _, j := range indexes[k+1:] {
				results[j] = result{abandoned: true}
			}
			return
		}
	}
}

// laneOf returns the lane, in [0, lanes), of a message key. It must not be the partition hash
// modulo the lanes: the keys of one partition all have the same partition hash modulo the number of
// partitions, so they would all share one lane whenever the lanes divide the partitions
// (concurrency 4 on 4 or 8 partitions), and lanes/partitions lanes when the partitions divide the
// lanes. So the partition hash (FNV-1a 64) goes through murmur3's finalizer first, whose every
// output bit depends on every input bit.
func laneOf(key string, lanes int) int {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return int(h % uint64(lanes))
}
