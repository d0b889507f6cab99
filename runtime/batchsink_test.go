package runtime_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
)

// batchRecorder is a sink that takes batches (stages.BatchSink): it records the size of each
// DeliverBatch call and the messages it delivered, fails for good a message whose n is 13 modulo 50,
// and fails transiently the first batch it gets (the service is away): its messages are then
// attempted one at a time.
type batchRecorder struct {
	mu        sync.Mutex
	sizes     []int
	delivered map[string]int
	away      bool
}

func (s *batchRecorder) Deliver(context.Context, *stages.Message, []stages.Write) ([]stages.Write, error) {
	return nil, errors.New("Deliver called on a sink that takes batches")
}

func (s *batchRecorder) DeliverBatch(_ context.Context, batch []stages.Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sizes = append(s.sizes, len(batch))
	if !s.away && len(batch) > 1 {
		s.away = true
		for i := range batch {
			batch[i].Err = stages.Transient(errors.New("connection refused"))
		}
		return
	}
	for i := range batch {
		d := &batch[i]
		if d.ID == "" || d.Message == nil {
			d.Err = errors.New("a delivery without its entry ID")
			continue
		}
		if err := d.Message.Decode(); err != nil {
			d.Err = err
			continue
		}
		if number(d.Message.Value["n"])%50 == 13 {
			d.Err = stages.Permanent(errors.New("refused: row 13"))
			continue
		}
		s.delivered[d.Message.Key]++
	}
}

// TestBatchSinkTakesReadBatches runs a sink that takes batches: it gets each read batch in one call
// (many messages per call), a failed message is dead-lettered on its own with its error, a batch
// that failed transiently is probed by one message and then delivered as a batch again, and every
// other message arrives once.
func TestBatchSinkTakesReadBatches(t *testing.T) {
	const n = 500
	plan := buildSource(t, `
pipeline "batches" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind   = "generate"
  count  = 500
  output = topic.in
  template = { k = "k${index}", n = index }
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`)
	c := server.open(t)
	rec := &batchRecorder{delivered: map[string]int{}}
	j := runJob(t, c, plan, runtime.Options{
		WrapSink: func(string, stages.Sink) stages.Sink { return rec },
	})
	failing := n / 50
	if s := j.node(t, "out"); s.In != n || s.Out != int64(n-failing) || s.DeadLettered != int64(failing) {
		t.Errorf("the sink took in %d, delivered %d and dead-lettered %d, want %d, %d, %d", s.In, s.Out, s.DeadLettered, n, n-failing, failing)
	}
	for i := 0; i < n; i++ {
		if got, want := rec.delivered["k"+itoa(int64(i))], 1-boolInt(i%50 == 13); got != want {
			t.Errorf("message %d delivered %d times, want %d", i, got, want)
		}
	}
	large, single := 0, 0
	for _, s := range rec.sizes {
		if s > 1 {
			large++
		} else {
			single++
		}
	}
	// After the batch that failed transiently, one message probes on its own, and once it is
	// delivered the rest of its batch goes as a batch again: only the probes and the reads of a
	// single entry are delivered alone.
	if single > 5 {
		t.Errorf("%d calls with one message: after the transient failure, the batch was delivered message by message", single)
	}
	t.Logf("%d calls for %d messages, %d with more than one message: %v", len(rec.sizes), n, large, rec.sizes)
	if large < 2 || len(rec.sizes) >= n {
		t.Errorf("%d calls for %d messages, %d with more than one message: the batches were not delivered at once", len(rec.sizes), n, large)
	}
	dl, err := admin.OpenDeadLetters(c, plan, "out")
	if err != nil {
		t.Fatal(err)
	}
	list, err := dl.List(context.Background())
	if err != nil || len(list) != failing {
		t.Fatalf("%d dead letters (%v), want %d", len(list), err, failing)
	}
	for _, d := range list {
		if !strings.Contains(d.Envelope.Error, "refused: row 13") {
			t.Errorf("a dead letter says %q", d.Envelope.Error)
		}
	}
}
