package runtime

import (
	"context"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// wakeAgain is how long a stop waits before it wakes the readers again: a worker may have sent
// its read just after the last round.
const wakeAgain = 2 * time.Millisecond

// wakeReaders ends the blocking reads of the run's workers (on rdb) when it stops, until done is closed, so
// that an idle worker does not wait out Options.Block before it sees the stop. A read ended this
// way returns nothing, as when its time is up (redis.Client.UnblockReads): nothing was delivered,
// so nothing is left pending. Where the client cannot do that (a cluster, a user without CLIENT
// UNBLOCK, see redis.ErrCannotUnblock) the reads wait out their Block, as before.
func wakeReaders(hard context.Context, rdb *redis.Client, clock stages.Clock, block time.Duration, done <-chan struct{}) {
	// The first rounds come quickly, for the reads of workers that are idle; then less and less
	// often, up to Options.Block, while the work in flight drains.
	for wait := wakeAgain; ; wait = min(2*wait, block) {
		if err := rdb.UnblockReads(hard); err != nil || hard.Err() != nil {
			return // unable, or Redis failing (whose dropped connections end the reads anyway)
		}
		t := clock.NewTimer(wait)
		select {
		case <-done:
			t.Stop()
			return
		case <-t.C():
		}
	}
}
