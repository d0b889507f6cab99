package runtime_test

import (
	"fmt"
	"testing"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/flowtest"
)

// How a job ends without waiting on timers: its end test runs when the process's own work is
// done, and its stop wakes the readers that block in Redis.

// TestJobEndsWhenItsWorkIsDone runs a job on a clock that never moves, so that the end test's
// timer never fires: the job ends only because finishing its work wakes the test. Every message
// arrives once.
func TestJobEndsWhenItsWorkIsDone(t *testing.T) {
	const n = 200
	c := server.open(t)
	out := fmt.Sprintf("drain-woken-%d:out", prefixes.Add(1))
	plan := buildSource(t, drainPipeline(out, n, false, "", `kind = "map"
  set    = { worked = true }`))
	j := startDrainingJob(t, plan, runtime.Options{Clock: flowtest.NewClock(flowtest.Epoch)})
	j.wait(t)
	if dups := tally(t, arrivals(t, c, out), n); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}
}
