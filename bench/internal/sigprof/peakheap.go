package sigprof

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"time"
)

// EnvPeakHeap names a directory where the process writes heap.pprof (the heap profile: what was
// live at the last collection, by where it was allocated) each time its live heap grows by a
// twentieth past its highest so far, and live, the time and size of that high. The last profile is
// the heap at its peak, which one taken when a run ends misses: where a process's peak RSS comes
// from. Without it StartPeakHeap does nothing.
const EnvPeakHeap = "FLOWBENCH_PEAK_HEAP_DIR"

// StartPeakHeap watches the live heap every 20 ms if EnvPeakHeap is set.
func StartPeakHeap() {
	dir := os.Getenv(EnvPeakHeap)
	if dir == "" {
		return
	}
	go func() {
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		var highest uint64
		for range time.Tick(20 * time.Millisecond) {
			metrics.Read(live)
			if v := live[0].Value.Uint64(); v > highest+highest/20 {
				highest = v
				write(dir, "heap", "heap.pprof")
				_ = os.WriteFile(filepath.Join(dir, "live"), fmt.Appendf(nil, "%s %d bytes\n", time.Now().Format(time.RFC3339Nano), v), 0o644)
			}
		}
	}()
}
