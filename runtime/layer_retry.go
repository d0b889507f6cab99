package runtime

import (
	"context"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// withRetries makes the attempts at a message. A failed attempt is retried by the node's retry
// policy: after a delay in the process, or, where the unit has a retry set and the node does not
// retry in place, with a delay longer than Options.RetryInPlaceUpTo, parked in the retry set (the
// result's retries) while later
// messages go on. A transient failure (the downstream is away) pauses the node instead: the next
// attempt waits at the node's breaker for its turn to probe, by the transient retry policy, which
// by default never gives up. A permanent failure, or a policy that gives up, fails the message for
// good (failedForGood). A shutdown abandons the message wherever it waits.
//
// Each retry starts again from the payload as it arrived, whatever the failed attempt changed.
func (r *processing) withRetries(n *node, attempt attemptFunc) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		payload, _ := m.msg.Payload()
		key, headers, entryTime := m.msg.Key, m.msg.Headers, m.msg.EntryTime
		firstFailure := m.firstFailure
		again := false
		for attempts := m.attempts + 1; ; attempts++ {
			if again {
				m.prefetched = nil // a retry reads anew
				m.msg = stages.NewMessage(key, payload, headers)
				m.msg.EntryTime = entryTime // a stateful stage's event time, when the message has none of its own
			}
			again = true
			m.outcome = outcomeFiltered // what a failed attempt's handler said does not count
			m.deadLetters = nil         // nor the dead letters it made
			probe, ok := n.breaker.pass(p.stopping)
			if !ok {
				return result{abandoned: true}, buf, nil // redelivered after the restart
			}
			start := len(buf)
			var err error
			buf, err = attempt(ctx, m, buf)
			transient := err != nil && stages.IsTransient(err)
			if !transient {
				n.breaker.succeeded(probe) // the attempt got an answer, good or bad
			}
			if err == nil {
				res := result{outs: buf[start:len(buf):len(buf)], deadLetters: m.deadLetters}
				m.deadLetters = nil
				return res, buf, nil
			}
			buf = buf[:start]
			if r.hard.Err() != nil {
				n.breaker.released(probe)
				return result{abandoned: true}, buf, nil // the failure may be the shutdown's doing
			}
			if d, delayed := stages.DelayOf(err); delayed {
				// Not a failure: the message may not go yet (a rate limit). It waits here, and is
				// attempted again as the same attempt.
				if !r.delay(n, d, p) {
					return result{abandoned: true}, buf, nil // redelivered after the restart
				}
				attempts--
				continue
			}
			n.stats.failedAttempts.Add(1)
			now := r.clock.Now()
			if firstFailure.IsZero() {
				firstFailure = now
			}
			policy := n.retry
			if transient {
				policy = n.transientRetry
			}
			if stages.IsPermanent(err) || policy.GivesUp(attempts, firstFailure, now) {
				n.breaker.released(probe)
				return result{}, buf, &failedForGood{err: err, attempts: attempts, firstFailure: firstFailure}
			}
			n.stats.retries.Add(1)
			if transient {
				after, _ := stages.RetryAfter(err)
				n.breaker.failed(probe, err, after)
				r.log.Debug("attempt failed transiently; waiting for the node's next probe", "node", n.name, "id", m.id, "attempt", attempts, "err", err)
				continue
			}
			delay := r.jittered(policy.Delay(attempts), policy.Jitter)
			if p.retrySet && !n.retryInPlace && delay > r.retryInPlaceUpTo {
				r.log.Debug("attempt failed; retry scheduled", "node", n.name, "id", m.id, "attempt", attempts, "delay", delay, "err", err)
				return result{retries: []redis.Retry{{
					Entry: redis.Entry{
						ID: m.id, Key: key, Payload: payload, Headers: headers,
						TraceParent: m.trace.parent, TraceState: m.trace.state, TraceDropped: m.trace.dropped,
					},
					Attempts: attempts, FirstFailure: firstFailure, LastError: r.redact(err.Error()),
					Due:   r.clock.Now().Add(delay),
					Stage: n.resumeAs, Path: m.path, // a fused stage's retry resumes the chain at that stage
				}}}, buf, err
			}
			r.log.Debug("attempt failed; retrying", "node", n.name, "id", m.id, "attempt", attempts, "delay", delay, "err", err)
			t := r.clock.NewTimer(delay)
			working := r.activity.waiting()
			select {
			case <-t.C():
				working()
			case <-p.stopping:
				working()
				t.Stop()
				return result{abandoned: true}, buf, nil // redelivered after the restart, retry count and all
			}
		}
	}
}

// delay waits d for a message that a node's kind delayed (stages.Delay), counting the wait as the
// node's delayed time; false when a shutdown came first.
func (r *processing) delay(n *node, d time.Duration, p pass) bool {
	n.stats.delaying.Add(1)
	start := r.clock.Now()
	defer func() {
		n.stats.delayed.Add(int64(r.clock.Now().Sub(start)))
		n.stats.delaying.Add(-1)
	}()
	t := r.clock.NewTimer(d)
	working := r.activity.waiting()
	defer working()
	select {
	case <-t.C():
		return true
	case <-p.stopping:
		t.Stop()
		return false
	}
}
