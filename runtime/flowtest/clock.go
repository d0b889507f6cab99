package flowtest

import (
	"sync"
	"time"

	"github.com/flowrun/flowrun/stages"
)

// Clock is a virtual clock: its time moves only when AdvanceTo moves it, and then every timer and
// ticker due on the way fires, in the order of their deadlines. It implements stages.Clock, so a
// pipeline's runtime, its kinds and transport/redis all run on it (runtime.Options.Clock), and a
// retry policy's minutes of backoff pass in the time it takes to process the messages.
//
// Go tests of custom kinds can use it too: NewClock, then AdvanceTo(Next()) to let the earliest
// timer fire.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  map[*virtualTimer]struct{} // armed timers and tickers
	changes uint64                     // counts every arming, stop and firing, for Changes
	// fired are the timers fired by the latest moves whose value may still wait in their channel:
	// a goroutine that has not yet woken up for it (see Undelivered).
	fired      []*virtualTimer
	onAdvance  []func(time.Time)
	sequence   uint64 // orders timers with the same deadline by their arming
	firedSince time.Time
}

// Epoch is where a new Clock's time starts: a fixed instant, so that runs are reproducible.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewClock returns a clock standing at start.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start, timers: map[*virtualTimer]struct{}{}}
}

// OnAdvance calls f with the new time after each move of the clock (an embedded Redis follows it).
func (c *Clock) OnAdvance(f func(time.Time)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onAdvance = append(c.onAdvance, f)
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires once the clock has moved d on.
func (c *Clock) NewTimer(d time.Duration) stages.Timer {
	t := &virtualTimer{clock: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.arm(t, d)
	return t
}

// NewTicker returns a ticker that fires every d of the clock's time. Like a time.Ticker it drops
// ticks that its reader is too slow for.
func (c *Clock) NewTicker(d time.Duration) stages.Ticker {
	if d <= 0 {
		panic("flowtest: non-positive interval for NewTicker")
	}
	t := &virtualTimer{clock: c, ch: make(chan time.Time, 1), period: d}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.arm(t, d)
	return virtualTicker{t}
}

// Next returns the earliest deadline of the armed timers and tickers; false when none is armed.
func (c *Clock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	found := false
	for t := range c.timers {
		if !found || t.when.Before(next) {
			next, found = t.when, true
		}
	}
	return next, found
}

// AdvanceTo moves the clock to at (never back), firing what is due on the way in deadline order;
// a ticker fires once for the move however many periods it spans, as a time.Ticker drops the
// ticks nobody read.
func (c *Clock) AdvanceTo(at time.Time) {
	c.mu.Lock()
	if at.Before(c.now) {
		at = c.now
	}
	c.fired = c.fired[:0]
	for {
		var due *virtualTimer
		for t := range c.timers {
			if !t.when.After(at) && (due == nil || t.when.Before(due.when) || (t.when.Equal(due.when) && t.seq < due.seq)) {
				due = t
			}
		}
		if due == nil {
			break
		}
		c.now = due.when
		c.fire(due, at)
	}
	c.now = at
	c.firedSince = time.Now()
	hooks := c.onAdvance
	c.mu.Unlock()
	for _, f := range hooks {
		f(at)
	}
}

// Changes counts every timer armed, stopped or fired so far: when it stands still, and nothing is
// Undelivered, no goroutine of the pipeline woke up for the clock.
func (c *Clock) Changes() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changes
}

// Undelivered reports whether a timer fired by the last move still holds its value: a goroutine
// is yet to wake up for it. A value left unread for longer than stale is taken as abandoned (a
// timer whose owner moved on without stopping it).
func (c *Clock) Undelivered(stale time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.firedSince) > stale {
		return false
	}
	for _, t := range c.fired {
		if len(t.ch) > 0 {
			return true
		}
	}
	return false
}

// arm sets t to fire d from now. The caller holds c.mu.
func (c *Clock) arm(t *virtualTimer, d time.Duration) {
	c.sequence++
	t.seq = c.sequence
	t.when = c.now.Add(max(d, 0))
	c.timers[t] = struct{}{}
	c.changes++
}

// fire delivers t's tick and re-arms a ticker past the move's end. The caller holds c.mu.
func (c *Clock) fire(t *virtualTimer, end time.Time) {
	select {
	case t.ch <- t.when:
	default: // the previous tick is still unread: drop this one, as time.Ticker does
	}
	c.fired = append(c.fired, t)
	c.changes++
	if t.period == 0 {
		delete(c.timers, t)
		return
	}
	for !t.when.After(end) {
		t.when = t.when.Add(t.period)
	}
	c.sequence++
	t.seq = c.sequence
}

// virtualTimer is a timer or (period > 0) a ticker of a Clock.
type virtualTimer struct {
	clock  *Clock
	ch     chan time.Time
	when   time.Time
	period time.Duration
	seq    uint64
}

func (t *virtualTimer) C() <-chan time.Time { return t.ch }

// Stop disarms the timer and reports whether it was armed.
func (t *virtualTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	_, armed := c.timers[t]
	delete(c.timers, t)
	select { // as with a time.Timer since Go 1.23, no value is received after Stop
	case <-t.ch:
	default:
	}
	c.changes++
	return armed
}

// Reset re-arms the timer to fire d from now and reports whether it was armed. As with a
// time.Timer since Go 1.23, a value not yet received is discarded.
func (t *virtualTimer) Reset(d time.Duration) bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	_, armed := c.timers[t]
	select {
	case <-t.ch:
	default:
	}
	c.arm(t, d)
	return armed
}

// virtualTicker is the stages.Ticker view of a periodic virtualTimer.
type virtualTicker struct{ t *virtualTimer }

func (k virtualTicker) C() <-chan time.Time { return k.t.ch }
func (k virtualTicker) Stop()               { k.t.Stop() }
func (k virtualTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("flowtest: non-positive interval for Ticker.Reset")
	}
	c := k.t.clock
	c.mu.Lock()
	k.t.period = d
	c.mu.Unlock()
	k.t.Reset(d)
}
