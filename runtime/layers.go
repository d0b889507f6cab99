package runtime

import (
	"context"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// A node processes a message through layers, each a small policy in a file of its own, around the
// node's handler (its kind's processor or sink):
//
//	metrics (layer_metrics.go)         how long the message took, how old it was
//	tracing (layer_tracing.go)         the message's processing span
//	dead letters (layer_deadletter.go) a message that failed for good goes to the dead letters
//	poison (layer_poison.go)           an entry delivered too often fails for good, unprocessed
//	retries (layer_retry.go)           failed attempts are retried in place or parked in the retry
//	                                   set, transient ones one probe at a time (breaker.go)
//	timeout (layer_timeout.go)         one attempt may take the node's timeout
//	handler                            the attempt itself
//
// The outer layers see a message once (a messageFunc); the timeout and the handler see each attempt
// (an attemptFunc). layers composes them once per node.

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
	// (fusion.go): the commit adds them to the stages' counts (outcomes.go). nil elsewhere.
	counts *batchCounts
	// stopping is closed when the worker stops: waits end, and the message is abandoned (neither
	// acknowledged nor dead-lettered, so that it is delivered again after the restart).
	stopping <-chan struct{}
}

// result is what processing one message came to.
type result struct {
	outs        []redis.Output
	deadLetters []redis.Output // the message's dead letters (a fused chain's stages may each give some)
	retries     []redis.Retry  // messages that wait in the retry set for their next attempt
	abandoned   bool           // shutdown interrupted it: not acked, not dead-lettered
}

// layers composes the node's policies around its handler.
func (r *runner) layers(n *node) messageFunc {
	attempt := r.withTimeout(n, n.handler.handle)
	return r.withMetrics(n, r.withTracing(n, r.withDeadLetters(n, r.withPoisonCheck(n, r.withRetries(n, attempt)))))
}

// processMessage runs a message through the node's layers.
func (r *runner) processMessage(n *node, m *message, buf []redis.Output, p pass) (result, []redis.Output) {
	if m.retry != nil && m.retry.Stage != "" && (n.chain == nil || n.chain.index(m.retry.Stage) < 0) {
		res, buf, _ := r.handOn(n, m, buf, p) // for a stage that ran fused after n, and no longer does
		return res, buf
	}
	res, buf, _ := n.process(r.hard, m, buf, p)
	return res, buf
}
