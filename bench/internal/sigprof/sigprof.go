// Package sigprof profiles a process between two signals, for flowbench -profile: SIGUSR1 writes
// DIR/allocs-start.pprof and starts a CPU profile; SIGUSR2 stops it and writes DIR/cpu.pprof,
// DIR/allocs.pprof and DIR/heap.pprof, then an empty DIR/done, which tells the harness that the
// profiles are complete. The allocations between the signals are
// go tool pprof -base DIR/allocs-start.pprof DIR/allocs.pprof.
package sigprof

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"
)

// EnvDir names the directory the profiles go to; without it Start does nothing.
const EnvDir = "FLOWBENCH_PROFILE_DIR"

// Start handles SIGUSR1 and SIGUSR2 if EnvDir is set.
func Start() {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		var cpu *os.File
		for sig := range sigs {
			switch {
			case sig == syscall.SIGUSR1 && cpu == nil:
				write(dir, "allocs", "allocs-start.pprof")
				f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
				if err == nil {
					err = pprof.StartCPUProfile(f)
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, "sigprof:", err)
					continue
				}
				cpu = f
			case sig == syscall.SIGUSR2 && cpu != nil:
				pprof.StopCPUProfile()
				_ = cpu.Close()
				cpu = nil
				write(dir, "allocs", "allocs.pprof")
				write(dir, "heap", "heap.pprof")
				_ = os.WriteFile(filepath.Join(dir, "done"), nil, 0o644)
			}
		}
	}()
}

func write(dir, profile, file string) {
	if f, err := os.Create(filepath.Join(dir, file)); err == nil {
		_ = pprof.Lookup(profile).WriteTo(f, 0)
		_ = f.Close()
	}
}
