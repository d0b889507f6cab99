package runtime_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/flowrun/flowrun/runtime"
)

// TestSplitPipelineRunsEveryPartition splits a pipeline between two processes with --stages (one
// runs the stage, the other the sink): each takes all the partitions of the nodes it runs, since
// its share of a node is counted among the processes that run that node, and every message
// arrives once.
func TestSplitPipelineRunsEveryPartition(t *testing.T) {
	const n = 200
	c := server.open(t)
	prefix := fmt.Sprintf("split-%d", prefixes.Add(1))
	plan := buildSource(t, fmt.Sprintf(`
pipeline "split" {
  key_prefix = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
stage "work" {
  kind  = "map"
  input = topic.in
  set   = { worked = true }
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.work
  stream = "%s:out"
}
`, prefix, prefix))
	publishRun(t, c, plan, "", 0, n)
	var logs [2]syncBuffer
	runtimes := make([]*runtime.Runtime, 2)
	done := make(chan error, 2)
	ctx, stop := context.WithCancel(deadline(t))
	defer stop()
	for i, nodes := range [][]string{{"work"}, {"out"}} {
		rt, err := runtime.New(plan, runtime.Options{Redis: c, Nodes: nodes, Logger: newLogger(&logs[i])})
		if err != nil {
			t.Fatal(err)
		}
		runtimes[i] = rt
		go func() {
			_, err := rt.Run(ctx)
			done <- err
		}()
	}
	waitFor(t, "every message to arrive", func() bool { return len(arrivals(t, c, prefix+":out")) == n })
	for i, rt := range runtimes {
		if leases := rt.Snapshot().Leases; leases != 4 {
			t.Errorf("process %d holds %d leases, want all 4 partitions of the node it runs", i, leases)
		}
	}
	if dups := tally(t, arrivals(t, c, prefix+":out"), n); dups > 0 {
		t.Errorf("%d duplicates", dups)
	}
	stop()
	for range runtimes {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
