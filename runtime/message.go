package runtime

import (
	"context"
	"time"

	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// What the per-message layers (layers.go) work with: a message as a node works on it, the
// handler that does the node's work, and the functions, pass and result of the layers.

// handler does a node's work on one message.
type handler interface {
	// handle processes m and appends the entries to write for it to outs. An error marked
	// stages.Permanent is not retried.
	handle(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error)
	// flush makes what handle delivered durable; it runs before a batch is acknowledged.
	flush(ctx context.Context) error
	// open and close bracket the run (a file sink opens its file).
	open(ctx context.Context) error
	close() error
}

// message is one input entry while a node works on it.
type message struct {
	id string
	// path tells apart the messages that the stages of a fused chain made of the entry id: the
	// index of the message among its siblings at each stage that made more than one ("" for an
	// entry read from a stream). With id, it identifies an effectively-once output.
	path      string
	partition int
	msg       stages.Message
	// inKey and inPayload are the entry's key and payload as read, for keptKey.
	inKey      string
	inPayload  []byte
	trace      traceContext // the trace context the message arrived with
	out        traceContext // the trace context its outputs carry: its processing span's
	deliveries int64        // from a reclaim; 0 when unknown
	// redelivered: the entry was delivered before, to this process or to one that died with it
	// (redis.Batch.Redelivered), so that an effect outside Redis may have happened already.
	redelivered bool
	// attempts were already made at this message: by earlier deliveries, or before it waited in
	// the retry set (retry, which it leaves once handled).
	attempts     int
	firstFailure time.Time
	retry        *redis.Retry
	state        *state.Batch // its batch's state writes, for a stateful node
	watermark    int64        // a stateful node's watermark as of the message, in Unix ms
	// outcome is what its handler said became of it when it wrote nothing (outcomes.go).
	outcome outcome
	// deadLetters are the dead letters its handler made in the current attempt of outputs that a
	// stage sent there (stages.Output.DeadLetter: a lookup's missing key, an aggregate's message late
	// for some of its windows). They are no outputs: they go to the result's dead letters, so that
	// they count as dead-lettered and a fused chain does not pass them on to its next stage.
	deadLetters []redis.Output
	// prefetched is what the node's stages.BatchReader read for the message's batch (a lookup's rows),
	// passed to Process in its context; nil on a retry, which reads anew.
	prefetched any
	// batched: a sink that takes batches made its first attempt with its batch, which came to
	// batchErr (sinkHandler.deliverBatch); its first attempt takes that result.
	batched  bool
	batchErr error
	// away, for a message of such a batch that failed transiently, is the batch's messages that
	// wait with it, at awayAt: once one of them is delivered, those after it go as a batch again.
	away   *sinkBatch
	awayAt int
}

// traceContext is the W3C trace context that travels with a message from entry to entry.
type traceContext struct {
	parent, state string
	// dropped is set when the entry's traceparent was invalid and dropped (see traceOf).
	dropped bool
}

// messageFunc processes one message to its result. Its outputs are appended to buf, and the
// result's outs is the appended part, so that a lane of messages shares one buffer. The error is
// the last attempt's, for the layers that report it.
type messageFunc func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error)

// attemptFunc makes one attempt at a message, appending its outputs to buf.
type attemptFunc func(ctx context.Context, m *message, buf []redis.Output) ([]redis.Output, error)

// pass is what the worker tells the layers about this processing of a message.
type pass struct {
	// retrySet: the unit has a retry set, where a retry due later than Options.RetryInPlaceUpTo
	// waits instead of in the process unless the node retries in place.
	retrySet bool
	// counts are, for a fused chain's batch, what became of the messages at each of its stages
	// (fused.go): the commit adds them to the stages' counts (outcomes.go). nil elsewhere.
	counts *batchCounts
	// stopping is closed when the worker stops: waits end, and the message is abandoned (neither
	// acknowledged nor dead-lettered, so that it is delivered again after the restart).
	stopping <-chan struct{}
	// measured collects the lane's metric measurements (layer_metrics.go); nil without metrics.
	measured *measurements
}

// result is what processing one message came to.
type result struct {
	outs        []redis.Output
	deadLetters []redis.Output // the message's dead letters (a fused chain's stages may each give some)
	retries     []redis.Retry  // messages that wait in the retry set for their next attempt
	abandoned   bool           // shutdown interrupted it: not acked, not dead-lettered
}
