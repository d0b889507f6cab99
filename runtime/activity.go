package runtime

import "sync/atomic"

// Activity counts the goroutines of a run that are working on something (a batch between its read
// and its commit) and not waiting on the run's Clock for it. A test on a virtual clock (package
// flowtest) moves time on only when it is zero, so that what is due at one instant is all done
// before the next: processing takes no virtual time. See Options.Activity.
type Activity struct{ working atomic.Int64 }

// Working returns the number of goroutines at work now.
func (a *Activity) Working() int64 { return a.working.Load() }

// add changes the count; a nil Activity counts nothing.
func (a *Activity) add(n int64) {
	if a != nil {
		a.working.Add(n)
	}
}

// waiting brackets a wait on the clock by a goroutine at work: call the function it returns when
// the wait is over.
func (a *Activity) waiting() (done func()) {
	if a == nil {
		return func() {}
	}
	a.working.Add(-1)
	return func() { a.working.Add(1) }
}
