package runtime_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// Three processes share a node of four partitions: shares of two, so one process holds fewer than
// its share for as long as the others hold theirs. Each is ready all the same (/readyz: connected
// to Redis, holding what it could take), as replicas of a Deployment must be to be counted
// available; between them they hold every partition once.
func TestProcessesThatDoNotDivideThePartitionsAreReady(t *testing.T) {
	c := server.open(t)
	plan := buildSource(t, `
pipeline "shared" {}
topic "in" { partitions = 4 }
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`)
	ctx, cancel := context.WithCancel(context.Background())
	var procs []*runtime.Runtime
	done := make(chan error, 3)
	for i := range 3 {
		rt, err := runtime.New(plan, runtime.Options{Redis: c, ProcessID: fmt.Sprintf("p%d", i),
			LeaseTTL: time.Second, PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, rt)
		go func() {
			_, err := rt.Run(ctx)
			done <- err
		}()
	}
	defer func() {
		cancel()
		for range procs {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	waitFor(t, "every process ready, the four partitions held once between them", func() bool {
		leases := 0
		for _, rt := range procs {
			if rt.Ready() != nil {
				return false
			}
			leases += rt.Snapshot().Leases
		}
		return leases == 4
	})
}
