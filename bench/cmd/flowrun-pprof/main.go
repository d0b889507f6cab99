// Command flowrun-pprof is flowrun with a profiler attached, for flowbench -profile: the same
// command line (cmd.Execute), plus, when FLOWBENCH_PROFILE_DIR is set, a CPU profile between
// SIGUSR1 and SIGUSR2 (see bench/internal/sigprof), and, when FLOWBENCH_PEAK_HEAP_DIR is set, the
// heap profile at the live heap's peak; with FLOWBENCH_PROFILE_WHOLE also set, the CPU profile of
// the whole run, for jobs. Unlike cmd.Main it leaves GOGC at Go's default: give it
// GOGC=400 (flowbench -flowrun-env GOGC=400) for flowrun's own.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/flowrun/flowrun/bench/internal/sigprof"
	"github.com/flowrun/flowrun/cmd"
)

func main() {
	sigprof.Start()
	sigprof.StartPeakHeap()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	sigprof.Whole(func() { code = cmd.Execute(ctx, os.Args[1:], cmd.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}) })
	stop()
	os.Exit(code)
}
