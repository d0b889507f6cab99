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

// EnvWhole, set beside EnvDir, asks a process that runs to its end (a job) to profile its whole
// run instead of the window between the signals (Whole).
const EnvWhole = "FLOWBENCH_PROFILE_WHOLE"

// Whole runs f, profiled from start to end if EnvDir and EnvWhole are set.
func Whole(f func()) {
	if os.Getenv(EnvWhole) == "" {
		f()
		return
	}
	Window(f)
}

// Start handles SIGUSR1 and SIGUSR2 if EnvDir is set.
func Start() {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		var stop func()
		for sig := range sigs {
			switch {
			case sig == syscall.SIGUSR1 && stop == nil:
				stop = begin(dir)
			case sig == syscall.SIGUSR2 && stop != nil:
				stop()
				stop = nil
			}
		}
	}()
}

// Window profiles f, as the signals would, if EnvDir is set: for a process that knows when its
// measured window starts and ends.
func Window(f func()) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		f()
		return
	}
	stop := begin(dir)
	defer stop()
	f()
}

// begin starts the profiles and returns the function that ends and writes them.
func begin(dir string) func() {
	write(dir, "allocs", "allocs-start.pprof")
	f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err == nil {
		if err = pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sigprof:", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		write(dir, "allocs", "allocs.pprof")
		write(dir, "heap", "heap.pprof")
		_ = os.WriteFile(filepath.Join(dir, "done"), nil, 0o644)
	}
}

func write(dir, profile, file string) {
	if f, err := os.Create(filepath.Join(dir, file)); err == nil {
		_ = pprof.Lookup(profile).WriteTo(f, 0)
		_ = f.Close()
	}
}
