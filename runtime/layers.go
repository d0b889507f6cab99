package runtime

import (
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

// layers composes the node's policies around its handler.
func (r *processing) layers(n *node) messageFunc {
	attempt := r.withTimeout(n, n.handler.handle)
	return r.withMetrics(n, r.withTracing(n, r.withDeadLetters(n, r.withPoisonCheck(n, r.withRetries(n, attempt)))))
}

// processMessage runs a message through the node's layers.
func (r *processing) processMessage(n *node, m *message, buf []redis.Output, p pass) (result, []redis.Output) {
	if m.retry != nil && m.retry.Stage != "" && (n.chain == nil || n.chain.index(m.retry.Stage) < 0) {
		res, buf, _ := r.handOn(n, m, buf, p) // for a stage that ran fused after n, and no longer does
		return res, buf
	}
	res, buf, _ := n.process(r.hard, m, buf, p)
	return res, buf
}
