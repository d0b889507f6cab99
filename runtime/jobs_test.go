package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/flowtest"
	redis "github.com/flowrun/flowrun/transport/redis"
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

// TestJobOnManyPartitionsSharesItsReads: a job whose stages run on more partitions than read full
// batches (16: each unit reads a share of two batches, and not ahead) delivers every message once
// and ends.
func TestJobOnManyPartitionsSharesItsReads(t *testing.T) {
	const n = 2000
	c := server.open(t)
	out := fmt.Sprintf("drain-shared-%d:out", prefixes.Add(1))
	pipeline := strings.ReplaceAll(drainPipeline(out, n, false, "", `kind = "map"
  set    = { worked = true }`), "partitions = 2", "partitions = 16")
	j := startDrainingJob(t, buildSource(t, pipeline), runtime.Options{})
	j.wait(t)
	if dups := tally(t, arrivals(t, c, out), n); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}
}

// TestStopWakesIdleReaders: with reads that block for an hour (a unit with a retry set reads no
// longer than until it next looks at the set, RetryPoll), a drained job and a service told to
// stop both end at once (each test gives up after minutes), with nothing left pending: the stop
// ends the blocked reads as if their time were up.
func TestStopWakesIdleReaders(t *testing.T) {
	const n = 50
	c := server.open(t)
	out := fmt.Sprintf("stop-woken-%d:out", prefixes.Add(1))
	plan := buildSource(t, drainPipeline(out, n, false, "", `kind = "map"
  set    = { worked = true }`))
	j := startDrainingJob(t, plan, runtime.Options{Block: time.Hour, RetryPoll: time.Hour})
	j.wait(t)
	if dups := tally(t, arrivals(t, c, out), n); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}

	// The stage and sink of the same pipeline as a service, with nothing left to do: every reader
	// blocks idle when the stop comes.
	rc := openURLs(t, redistest.Shared(t).URL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: rc, Nodes: []string{"work", "out"}, Block: time.Hour, RetryPoll: time.Hour, Logger: newLogger(&syncBuffer{}),
			PollInterval: time.Hour, DrainTimeout: 2 * time.Second})
		ended <- err
	}()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	waitFor(t, "the service to take its partitions", func() bool {
		for p := range 2 {
			if _, _, held, err := c.LeaseHolder(context.Background(), keys.Lease("in", p, "work")); err != nil || !held {
				return false
			}
		}
		return true
	})
	cancel()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the service: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the service did not stop")
	}
	for p := range 2 {
		if backlog := backlogOf(t, c, keys.Stream("in", p), "work"); backlog != 0 {
			t.Errorf("partition %d has %d entries unread or pending after the stop, want none", p, backlog)
		}
	}
}
