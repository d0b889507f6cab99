// Package outage tells one outage of Redis from many failed calls. When Redis goes away, every
// worker, source and timer of a process finds out at once and retries on its own backoff; a
// Tracker turns that into two log lines, one when the first call fails and one when calls succeed
// again, and says meanwhile whether Redis is failing (for metrics and readiness).
//
// It owns that state and its log lines. It does not retry anything, nor decide which errors end
// the run (the runtime's failures do).
package outage

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flowrun/stages"
)

// When Redis goes away, every worker, source and timer of the process finds out at once, and
// each retries on its own backoff. A Tracker turns that into two log lines: one when the first call
// fails, naming what failed and why, and one when a call succeeds again, saying for how long Redis
// was gone. What failed in between is logged at debug level.

// outageSettle is how long calls must have stopped failing before an outage counts as over: at
// its start and its end, calls in flight on other connections fail and succeed in turn for a
// moment, which is one outage, not several.
const outageSettle = time.Second

// New returns a Tracker that logs to log, on clock.
func New(log *slog.Logger, clock stages.Clock) *Tracker { return &Tracker{log: log, clock: clock} }

// Tracker tracks whether Redis answers this process.
type Tracker struct {
	log   *slog.Logger
	clock stages.Clock
	down  atomic.Bool // read on every successful call, so kept apart from the lock

	mu          sync.Mutex
	since       time.Time
	lastFailure time.Time
	failures    int64
	rechecked   bool // the run's permissions were checked again in this outage
}

// Recheck reports whether the run's permissions are yet to be checked again in this outage.
func (o *Tracker) Recheck() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	first := !o.rechecked
	o.rechecked = true
	return first
}

// Failed records a failed call to Redis: what was being done, and the error.
func (o *Tracker) Failed(what string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures++
	o.lastFailure = o.clock.Now()
	if !o.since.IsZero() {
		o.log.Debug("Redis is still failing", "while", what, "err", err)
		return
	}
	o.since = o.clock.Now()
	o.down.Store(true)
	o.log.Warn("Redis is failing: every part of the pipeline waits and retries until it answers again; nothing is lost meanwhile",
		"while", what, "err", err)
}

// OK records a call to Redis that succeeded; it ends the outage once calls have stopped failing
// for outageSettle.
func (o *Tracker) OK() {
	if !o.down.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() || o.clock.Now().Sub(o.lastFailure) < outageSettle {
		return
	}
	o.log.Info("Redis answers again", "after", o.clock.Now().Sub(o.since).Round(time.Millisecond), "failed_calls", o.failures)
	o.since, o.failures, o.rechecked = time.Time{}, 0, false
	o.down.Store(false)
}

// Failing reports whether Redis is failing now, and since when.
func (o *Tracker) Failing() (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.since, !o.since.IsZero()
}
