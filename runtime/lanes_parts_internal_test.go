package runtime

import (
	"context"
	goruntime "runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// An inline stage's large batch is processed in contiguous parts at once, and comes out as if it
// had been processed in one: every output in the batch's order. When shutdown abandons a message,
// every later message of the batch is abandoned, in whichever part, and a fused chain counts only
// the messages before it (the others are delivered again after the restart, and counted then).
func TestAnInlineStagesBatchInPartsIsTheBatchInOne(t *testing.T) {
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(4))
	const batch = 1000
	for _, abandonAt := range []int{-1, 10, 300, 600, 999} {
		t.Run("abandon at "+strconv.Itoa(abandonAt), func(t *testing.T) {
			var calls atomic.Int64
			n := &node{typ: "stage", name: "s", inline: true, ordering: flow.OrderByKey, lanes: 1}
			n.process = func(_ context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
				calls.Add(1)
				if m.id == strconv.Itoa(abandonAt) {
					return result{abandoned: true}, buf, nil
				}
				p.counts.addChain([]counts{{in: 1, out: 1}})
				buf = append(buf, redis.Output{Stream: m.id})
				return result{outs: buf[len(buf)-1:]}, buf, nil
			}
			if parts := computeParts(n, batch); parts != 3 {
				t.Fatalf("%d parts, want 3 (4 cores, %d messages of at least %d)", parts, batch, minPart)
			}
			msgs := make([]*message, batch)
			for i := range msgs {
				msgs[i] = &message{id: strconv.Itoa(i)}
			}
			r := &processing{activity: &Activity{}, hard: context.Background()}
			counted := &batchCounts{nodes: make([]counts, 1)}
			results := r.processAll(n, msgs, pass{counts: counted}, nil)
			done := batch
			if abandonAt >= 0 {
				done = abandonAt
			}
			for i, res := range results {
				switch {
				case i < done && (res.abandoned || len(res.outs) != 1 || res.outs[0].Stream != strconv.Itoa(i)):
					t.Fatalf("message %d: %+v, want its own output", i, res)
				case i >= done && !res.abandoned:
					t.Fatalf("message %d after the abandoned %d: %+v, want it abandoned too", i, abandonAt, res)
				}
			}
			if c := counted.nodes[0]; c.in != int64(done) || c.out != int64(done) {
				t.Errorf("counted in %d out %d, want %d each (%d calls)", c.in, c.out, done, calls.Load())
			}
		})
	}
}

// A sink, a stateful stage, a stage of strict partition order and a small batch take one part.
func TestWhatTakesItsBatchInOnePart(t *testing.T) {
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(4))
	for _, c := range []struct {
		name  string
		n     *node
		count int
	}{
		{"a sink", &node{typ: "sink", inline: true, ordering: flow.OrderByKey}, 1000},
		{"a stateful stage", &node{typ: "stage", inline: true, stateful: true, ordering: flow.OrderByKey}, 1000},
		{"ordering partition", &node{typ: "stage", inline: true, ordering: flow.OrderByPartition}, 1000},
		{"a stage that waits", &node{typ: "stage", ordering: flow.OrderByKey}, 1000},
		{"a small batch", &node{typ: "stage", inline: true, ordering: flow.OrderByKey}, 2*minPart - 1},
	} {
		if parts := computeParts(c.n, c.count); parts != 1 {
			t.Errorf("%s: %d parts, want 1", c.name, parts)
		}
	}
}
