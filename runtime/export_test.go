package runtime

import "time"

// SetRateSampling makes rt sample its counters every interval, with rates over window intervals,
// so that tests see rates change without waiting seconds. Call it before Run.
func SetRateSampling(rt *Runtime, every time.Duration, window int) {
	s := &rt.r.obs.rates
	s.mu.Lock()
	defer s.mu.Unlock()
	s.every, s.window = every, window
}
