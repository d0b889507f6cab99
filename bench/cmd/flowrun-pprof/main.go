// Command flowrun-pprof is flowrun with a profiler attached, for flowbench -profile: the same
// command line (cmd.Execute), plus, when FLOWBENCH_PROFILE_DIR is set, a CPU profile between
// SIGUSR1 and SIGUSR2. On SIGUSR2 it writes DIR/cpu.pprof, DIR/allocs.pprof and DIR/heap.pprof,
// then an empty DIR/done.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"github.com/flowrun/flowrun/cmd"
)

func main() {
	if dir := os.Getenv("FLOWBENCH_PROFILE_DIR"); dir != "" {
		go profile(dir)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cmd.Execute(ctx, os.Args[1:], cmd.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}

func profile(dir string) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	var cpu *os.File
	for sig := range sigs {
		switch {
		case sig == syscall.SIGUSR1 && cpu == nil:
			f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
			if err == nil {
				err = pprof.StartCPUProfile(f)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "flowrun-pprof:", err)
				continue
			}
			cpu = f
		case sig == syscall.SIGUSR2 && cpu != nil:
			pprof.StopCPUProfile()
			_ = cpu.Close()
			cpu = nil
			for _, name := range []string{"allocs", "heap"} {
				if f, err := os.Create(filepath.Join(dir, name+".pprof")); err == nil {
					_ = pprof.Lookup(name).WriteTo(f, 0)
					_ = f.Close()
				}
			}
			_ = os.WriteFile(filepath.Join(dir, "done"), nil, 0o644)
		}
	}
}
