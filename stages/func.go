package stages

import (
	"context"
	"time"
)

// Func processes one message and returns the messages to pass on: none to drop it, the same message
// to pass it, several to split it. An error fails this attempt; the stage's retry policy decides
// whether it is retried, unless the error is Permanent.
type Func func(ctx context.Context, m Message) ([]Message, error)

// StatefulFunc is a Go stage function that keeps state: per-key values and durable timers in its
// input partition, with the guarantees of the built-in stateful kinds (dedupe, aggregate). Its stage
// is stateful: it needs ordering = "key" or "partition", and processes each partition's messages one
// after another, in order. What Process and OnTimer write through state is committed with the
// acknowledgement of the batch, in one step fenced by the partition's lease; a failed attempt's
// writes are dropped with it; and the state moves with the lease, with nothing to restore, when
// another process takes the partition over. See State. The state is the input partition's:
// messages that share state must share a partition, so key the input topic by what the state is
// kept by (the message's key, say). Record counts what the function finds late or repeated, as
// the built-in kinds do.
//
// Time is event time. Before Process is called, the stage has observed the message's event time
// (the stage's event_time attribute, or the time its entry was written), so state.Watermark, the
// latest event time of the partition, includes it. A timer is due once the watermark reaches it.
type StatefulFunc struct {
	// Process processes one message, as a Func does, with the state of the message's partition.
	// Every call on state takes ctx.
	Process func(ctx context.Context, m Message, state State) ([]Message, error)
	// OnTimer, when set, is called for each due timer that Process or OnTimer set, earliest first,
	// with the state of the batch that moved the watermark past it; what it returns goes to the
	// stage's output, committed with that batch. The timer is cancelled unless OnTimer sets it again.
	// An error keeps the timer and processes the batch again; a Permanent one drops the timer. A
	// function without OnTimer cannot set timers.
	OnTimer func(ctx context.Context, timer string, at time.Time, state State) ([]Message, error)
	// FireAtEnd fires every timer of the stage when a job's inputs are drained (flowrun run
	// --until-drained), whatever the watermark: for timers that emit results, as windows do, so
	// that a job's output is complete. Leave it unset for timers that forget (the default), which
	// then stay for the next run.
	FireAtEnd bool
}
