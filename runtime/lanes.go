package runtime

import (
	"github.com/sourcegraph/conc"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// processAll processes a batch. Nodes that only compute, keep strict partition order, or keep state
// take the messages one after another: a stateful stage's watermark moves with each message in the
// partition's order, so that what it decides (a key forgotten, an event late) does not depend on
// how lanes interleave. Others spread them over lanes that run in parallel: with ordering
// "key" all messages of a key share a lane (unkeyed messages share lane 0), so each key keeps its
// order; with "none" messages go to the lanes in turn. Results come back in input order.
//
// When shutdown abandons a message, the rest of its lane is abandoned too: acking a later message of
// the same key while an earlier one waits for redelivery would reorder the key.
func (r *processing) processAll(n *node, msgs []*message, p pass) []result {
	results := make([]result, len(msgs))
	if n.inline || n.stateful || n.lanes <= 1 || n.ordering == flow.OrderByPartition || len(msgs) == 1 {
		r.processLane(n, msgs, allIndexes(len(msgs)), results, p)
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
	// Each lane's goroutine is at work in its own right; the caller's waits for them (Activity).
	var wg conc.WaitGroup
	for _, lane := range lanes {
		if len(lane) > 0 {
			r.activity.add(1)
			wg.Go(func() {
				defer r.activity.add(-1)
				r.processLane(n, msgs, lane, results, p)
			})
		}
	}
	done := r.activity.waiting()
	wg.Wait()
	done()
	return results
}

// processLane processes the messages at the given indexes in order; their outputs share one buffer.
func (r *processing) processLane(n *node, msgs []*message, indexes []int, results []result, p pass) {
	p.measured = r.measuring()
	defer r.record(p.measured)
	buf := make([]redis.Output, 0, len(indexes))
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

func allIndexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
