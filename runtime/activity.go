package runtime

import "sync/atomic"

// Activity counts the goroutines of a run that are working on something (a batch between its read
// and its commit) and not waiting on the run's Clock for it. A test on a virtual clock (package
// flowtest) moves time on only when it is zero, so that what is due at one instant is all done
// before the next: processing takes no virtual time. See Options.Activity.
type Activity struct {
	working atomic.Int64
	// The runner's own count: parent is Options.Activity (nil for none), which counts the same,
	// and idle is told (without waiting) each time the count drops to zero: a job's end test runs
	// then (watchDrain).
	parent *Activity
	idle   chan<- struct{}
}

// Working returns the number of goroutines at work now.
func (a *Activity) Working() int64 { return a.working.Load() }

// add changes the count; a nil Activity counts nothing.
func (a *Activity) add(n int64) {
	if a == nil {
		return
	}
	if a.working.Add(n) == 0 && a.idle != nil {
		select {
		case a.idle <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	a.parent.add(n)
}

// waiting brackets a wait on the clock by a goroutine at work: call the function it returns when
// the wait is over.
func (a *Activity) waiting() (done func()) {
	if a == nil {
		return func() {}
	}
	a.add(-1)
	return func() { a.add(1) }
}
