// Command flowrun-faults is flowrun with a slow stage function, for the fault-injection tests: a
// batch takes long enough that a SIGKILL lands in the middle of one.
package main

import (
	"context"
	"time"

	"github.com/flowrun/flowrun/cmd"
	"github.com/flowrun/flowrun/stages"
)

func init() {
	stages.Register("faults.slow", func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
		t := time.NewTimer(time.Millisecond)
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
