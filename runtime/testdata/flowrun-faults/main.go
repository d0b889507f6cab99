// Command flowrun-faults is flowrun with a slow stage function, for the fault-injection tests: each
// message takes at least 2ms, so a run of thousands of messages takes seconds and a SIGKILL lands in
// the middle of it.
package main

import (
	"context"
	"time"

	"github.com/flowrun/flowrun/cmd"
	"github.com/flowrun/flowrun/stages"
)

func init() {
	stages.Register("faults.slow", func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
		t := time.NewTimer(2 * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []stages.Message{m}, nil
	})
}

func main() { cmd.Main() }
