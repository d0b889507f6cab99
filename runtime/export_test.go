package runtime

import (
	"time"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// SetRateSampling makes rt sample its counters every interval, with rates over window intervals,
// so that tests see rates change without waiting seconds. Call it before Run.
func SetRateSampling(rt *Runtime, every time.Duration, window int) {
	s := &rt.r.obs.rates
	s.mu.Lock()
	defer s.mu.Unlock()
	s.every, s.window = every, window
}

// AccessChecks returns what rt's run checks at start.
func AccessChecks(rt *Runtime) []redis.AccessCheck { return rt.r.access().accessChecks().Checks() }

// AccessRule returns the ACL SETUSER rule that grants everything rt's run checks at start.
func AccessRule(rt *Runtime) string { return rt.r.rdb.AccessRule(AccessChecks(rt)) }
