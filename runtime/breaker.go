package runtime

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flowrun/stages"

	"github.com/flowrun/flowrun/flow"
)

// When a stage's or sink's attempts fail transiently (stages.IsTransient: its downstream service
// refuses connections, times out, answers 503), the fault is not the message's, and retrying every
// message on its own would only hammer a service that is down and burn through retry budgets. So
// each node has a circuit breaker: the first transient failure opens it, and while it is open the
// node's messages wait where they are, holding their partitions back (nothing new is read), and one
// attempt at a time goes through as a probe, spaced by the node's transient retry policy. A probe
// that succeeds (or fails for another reason: the service answered) closes the breaker, and every
// waiting message goes on. Only the probing message spends its attempts, so with a retry policy
// that has a limit, a long outage dead-letters messages one by one, at the probes' pace. The probes
// go to the waiting messages in turn, longest waiting first, and a message whose probe failed waits
// at the back: no message spends its attempts while others wait.

// breaker is a node's circuit breaker.
type breaker struct {
	log      *slog.Logger // the node's
	clock    stages.Clock
	policy   flow.RetryPolicy // spaces the probes
	redact   func(string) string
	jittered func(d time.Duration, jitter float64) time.Duration
	activity *Activity // the run's: a waiter is not at work

	// isOpen mirrors open, so that the attempts of a node whose breaker is closed (nearly all of
	// them) take no lock.
	isOpen atomic.Bool

	mu        sync.Mutex
	open      bool
	since     time.Time // when it opened
	probing   bool      // a probe is in flight
	probes    int       // failed probes since it opened, for the backoff
	nextProbe time.Time
	changed   chan struct{} // closed, and replaced, whenever a waiter may go on
	lastErr   string
	// Waiters take a ticket, from last, and the next probe goes to the smallest one waiting.
	last    uint64
	waiting map[uint64]bool
}

func newBreaker(log *slog.Logger, policy flow.RetryPolicy, clock stages.Clock, redact func(string) string,
	jittered func(d time.Duration, jitter float64) time.Duration, activity *Activity) *breaker {
	return &breaker{log: log, clock: clock, policy: policy, redact: redact, jittered: jittered, activity: activity,
		changed: make(chan struct{}), waiting: map[uint64]bool{}}
}

// pass waits until a message may be attempted: at once while the breaker is closed; while it is
// open, until it closes, or until it is this message's turn to probe. It reports whether the
// attempt is a probe, and false in ok when stopping closed first.
func (b *breaker) pass(stopping <-chan struct{}) (probe, ok bool) {
	if !b.isOpen.Load() {
		return false, true
	}
	var timer stages.Timer
	var ticket uint64
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if ticket != 0 {
			b.mu.Lock()
			if b.first() == ticket {
				b.wake() // the next in line becomes the first
			}
			delete(b.waiting, ticket)
			b.mu.Unlock()
		}
	}()
	for {
		b.mu.Lock()
		if !b.open {
			b.mu.Unlock()
			return false, true
		}
		if ticket == 0 {
			b.last++
			ticket = b.last
			b.waiting[ticket] = true
		}
		now := b.clock.Now()
		first := !b.probing && b.first() == ticket
		if first && !now.Before(b.nextProbe) {
			b.probing = true
			b.mu.Unlock()
			return true, true
		}
		// The first in line waits for the probe's time too; the others, for a change.
		changed := b.changed
		var due <-chan time.Time
		if first {
			if timer == nil {
				timer = b.clock.NewTimer(b.nextProbe.Sub(now))
			} else {
				timer.Reset(b.nextProbe.Sub(now))
			}
			due = timer.C()
		}
		b.mu.Unlock()
		working := b.activity.waiting()
		select {
		case <-changed:
		case <-due:
		case <-stopping:
			working()
			return false, false
		}
		working()
	}
}

// succeeded records an attempt that did not fail transiently: the node's downstream answers.
func (b *breaker) succeeded(probe bool) {
	if !probe && !b.isOpen.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	if !b.open {
		return
	}
	b.open, b.probes = false, 0
	b.isOpen.Store(false)
	b.log.Info("attempts succeed again; the node goes on", "paused", b.clock.Now().Sub(b.since).Round(time.Millisecond))
	b.wake()
}

// failed records an attempt that failed transiently. The first opens the breaker; a failed probe
// puts the next one off by the policy's backoff, or by what the service asked for (after).
func (b *breaker) failed(probe bool, err error, after time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	b.lastErr = b.redact(err.Error())
	if !b.open {
		b.open, b.since, b.probes = true, now, 0
		b.isOpen.Store(true)
		b.nextProbe = now.Add(max(b.jittered(b.policy.Delay(1), b.policy.Jitter), after))
		b.log.Warn("attempts fail transiently: the node pauses and tries one message at a time until they succeed; nothing is dead-lettered meanwhile",
			"err", b.lastErr, "retry_policy", policyName(b.policy))
	}
	if probe {
		b.probing = false
		b.probes++
		b.nextProbe = now.Add(max(b.jittered(b.policy.Delay(b.probes+1), b.policy.Jitter), after))
		b.wake()
	}
}

// released gives the probe up without a result (its message was dead-lettered or abandoned).
func (b *breaker) released(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.wake()
	b.mu.Unlock()
}

// pausedSince reports when the breaker opened, while it is open, and its last error.
func (b *breaker) pausedSince() (time.Time, string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.since, b.lastErr, b.open
}

// first returns the smallest ticket waiting. Called with b.mu held.
func (b *breaker) first() uint64 {
	var least uint64
	for t := range b.waiting {
		if least == 0 || t < least {
			least = t
		}
	}
	return least
}

// wake lets every waiter look again. Called with b.mu held.
func (b *breaker) wake() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func policyName(p flow.RetryPolicy) string {
	if p.Name == "" {
		return "default (without limit)"
	}
	return p.Name
}
