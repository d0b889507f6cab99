package runtime

import "time"

// SetClaimIdle makes the nodes of rt take over entries that another consumer of a partition
// without a lease left pending once they have been idle for d (and hold the due retries they take
// for d), instead of twice the node's timeout plus 30 seconds, so that a test of the takeover need
// not wait half a minute. Call it before Run.
func SetClaimIdle(rt *Runtime, d time.Duration) {
	for _, n := range rt.r.nodes {
		n.claimIdle = d
	}
}
