package flowtest

import (
	"context"
	"errors"
	"testing"

	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/stages"
)

// refusingEmitter refuses every message, as a source's emitter does once the source has stopped or
// lost its lease while Emit waited.
type refusingEmitter struct{ stages.Emitter }

var errStopped = errors.New("the source stopped")

func (refusingEmitter) Emit(context.Context, stages.Message, stages.Origin) error { return errStopped }

// A message the dying source took but could not hand over is the next source's to produce, under
// the same ID: a crash in a test loses nothing a real source would produce again.
func TestAFeedKeepsWhatAStoppedSourceCouldNotEmit(t *testing.T) {
	f := newFeed()
	f.push(testfile.Message{Key: "k1"}, testfile.Message{Key: "k2"})
	err := feedSource{f}.Produce(context.Background(), refusingEmitter{})
	if !errors.Is(err, errStopped) {
		t.Fatalf("Produce returned %v, want the emitter's error", err)
	}
	if n := f.queued(); n != 2 {
		t.Fatalf("%d messages wait after the refusal, want 2", n)
	}
	m, ok := f.take()
	if !ok || m.msg.Key != "k1" || m.id != "test-1" {
		t.Fatalf("the next source takes %+v (%v), want k1 as test-1", m, ok)
	}
}

// A source whose context has ended takes nothing, even when a message is ready at the same moment.
func TestAStoppedFeedSourceTakesNothing(t *testing.T) {
	f := newFeed()
	f.push(testfile.Message{Key: "k1"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (feedSource{f}).Produce(ctx, refusingEmitter{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Produce returned %v, want context.Canceled", err)
	}
	if n := f.queued(); n != 1 {
		t.Fatalf("%d messages wait, want 1", n)
	}
}
