// Command flowrun-faults is flowrun with stage functions for the fault-injection tests:
//
//   - faults.slow makes each message take at least 2ms, so a run of thousands of messages takes
//     seconds and a SIGKILL lands in the middle of it;
//   - faults.hold holds each message that has a "hold" field (a file's path) until that file
//     exists, after creating the file named by its "entered" field: a gate that the test, in
//     another process, sees closed and opens, so that a fault lands while the message is in
//     flight, whatever the machine's speed. Other messages pass at once.
package main

import (
	"context"
	"os"
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
	}, stages.KeepsKey())
	stages.Register("faults.hold", func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
		gate, _ := m.Value["hold"].(string)
		if gate == "" {
			return []stages.Message{m}, nil
		}
		if entered, _ := m.Value["entered"].(string); entered != "" {
			if err := os.WriteFile(entered, nil, 0o644); err != nil {
				return nil, err
			}
		}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := os.Stat(gate); err == nil {
				return []stages.Message{m}, nil
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}, stages.KeepsKey())
}

func main() { cmd.Main() }
