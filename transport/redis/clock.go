package redis

import "time"

// Clock is where the client takes the time from: the heartbeat's expiries, the producer's linger.
// The runtime passes its own (WithClock), so that a test can drive everything on a virtual clock;
// a new client uses the wall clock.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's timer.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// wallClock is the Clock of a new client.
type wallClock struct{}

func (wallClock) Now() time.Time                 { return time.Now() }
func (wallClock) NewTimer(d time.Duration) Timer { return wallTimer{time.NewTimer(d)} }

type wallTimer struct{ t *time.Timer }

func (t wallTimer) C() <-chan time.Time        { return t.t.C }
func (t wallTimer) Stop() bool                 { return t.t.Stop() }
func (t wallTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

// WithClock returns a client on the same connections that takes the time from clock.
func (c *Client) WithClock(clock Clock) *Client {
	clocked := *c
	clocked.clock = clock
	return &clocked
}

// now is the client's time.
func (c *Client) now() time.Time {
	if c.clock == nil {
		return time.Now() // a client made by a test's struct literal
	}
	return c.clock.Now()
}

// newTimer is a timer of the client's clock.
func (c *Client) newTimer(d time.Duration) Timer {
	if c.clock == nil {
		return wallClock{}.NewTimer(d)
	}
	return c.clock.NewTimer(d)
}
