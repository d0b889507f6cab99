package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/bench/internal/sigprof"
)

// The harness runs every system under test as a child process, which is this binary started as
// `flowbench child KIND ...` (except flowrun itself, which is bin/flowrun): the raw go-redis hops,
// the Watermill flows, and the two publishers.

// pubReport is what a publishing child prints on standard output when it is done.
type pubReport struct {
	N         int   `json:"n"`
	ElapsedNS int64 `json:"elapsed_ns"`
	CPUNS     int64 `json:"cpu_ns"`    // user+system CPU of the publishing window
	MaxRSSKB  int64 `json:"maxrss_kb"` // peak resident set of the whole process
}

func runChild(args []string) error {
	if len(args) == 0 {
		return errors.New("child: which kind?")
	}
	sigprof.Start()
	// SIGTERM ends a child at once and cleanly: the harness has measured what it wanted.
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, os.Interrupt)
		<-c
		os.Exit(0)
	}()
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	addr := fs.String("addr", "", "Redis address")
	streams := fs.String("streams", "", "comma-separated streams: the input, then each hop's output")
	stream := fs.String("stream", "", "stream to publish to (pub-raw)")
	pipeline := fs.String("pipeline", "", "flowrun pipeline file (pub-flowrun)")
	topic := fs.String("topic", "in", "topic to publish to (pub-flowrun)")
	n := fs.Int("n", 0, "messages to publish")
	g := fs.Int("g", 4, "publishing goroutines")
	consumers := fs.Int("consumers", 1, "Watermill subscribers per stage (0: one with default settings)")
	pool := fs.Int("pool", 0, "go-redis pool size (0: go-redis default)")
	batch := fs.Int("batch", 0, "runtime.Options.BatchSize (fw-run)")
	in := fs.String("in", "", "input file (raw-q0)")
	out := fs.String("out", "", "output file (raw-q0)")
	async := fs.Bool("async", false, "publish one message at a time with Publish instead of PublishBatch (pub-flowrun)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	ctx := context.Background()
	switch args[0] {
	case "raw-hops":
		return rawHops(ctx, *addr, strings.Split(*streams, ","))
	case "watermill":
		return watermillHops(ctx, *addr, strings.Split(*streams, ","), *consumers, *pool)
	case "pub-raw":
		return report(measure(func() (int, error) {
			rdb := goredis.NewClient(&goredis.Options{Addr: *addr})
			defer func() { _ = rdb.Close() }() // the publishing is over
			return *n, publishParallel(ctx, rdb, *stream, formatPlain, phasePublish, *n, *g)
		}))
	case "fw-run":
		return runFlowrunInProcess(ctx, *addr, *pipeline, *batch)
	case "pub-flowrun":
		return report(publishFlowrun(ctx, *addr, *pipeline, *topic, *n, *g, *async))
	case "raw-q0":
		var err error
		sigprof.Window(func() { err = rawNexmarkQ0(ctx, *addr, *in, *out) }) // with -profile
		return err
	case "busy":
		return busyLoop(*g)
	}
	return fmt.Errorf("child: unknown kind %q", args[0])
}

// measure runs a publishing window and reports its duration and CPU time.
func measure(f func() (int, error)) (pubReport, error) {
	var n int
	var err error
	cpu0 := selfCPU()
	t0 := time.Now()
	sigprof.Window(func() { n, err = f() })
	return pubReport{N: n, ElapsedNS: int64(time.Since(t0)), CPUNS: int64(selfCPU() - cpu0)}, err
}

func report(r pubReport, err error) error {
	if err != nil {
		return err
	}
	// VmHWM, not the rusage's maxrss, which counts the harness's memory too (child.watchPeak).
	if _, peak, err := procMemKB("self"); err == nil {
		r.MaxRSSKB = peak
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rawHops is RAW-k: k forwarding hops written directly against go-redis, each one goroutine that
// reads up to 1000 entries with XREADGROUP and forwards them with one pipeline of XADDs and an
// XACK. It is the floor that flowrun's stages are measured against.
func rawHops(ctx context.Context, addr string, streams []string) error {
	if len(streams) < 2 {
		return errors.New("raw-hops: need at least an input and an output stream")
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	defer func() { _ = rdb.Close() }() // the child is done
	var wg sync.WaitGroup
	errs := make(chan error, len(streams))
	for i := 1; i < len(streams); i++ {
		in, out, group := streams[i-1], streams[i], fmt.Sprintf("hop%d", i)
		if err := rdb.XGroupCreateMkStream(ctx, in, group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- rawHop(ctx, rdb, in, out, group)
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(<-errs)
}

func rawHop(ctx context.Context, rdb *goredis.Client, in, out, group string) error {
	args := &goredis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{in, ">"}, Count: 1000, Block: 500 * time.Millisecond}
	for {
		res, err := rdb.XReadGroup(ctx, args).Result()
		if errors.Is(err, goredis.Nil) {
			continue
		}
		if err != nil {
			return fmt.Errorf("hop %s -> %s: %w", in, out, err)
		}
		msgs := res[0].Messages
		ids := make([]string, len(msgs))
		pipe := rdb.Pipeline()
		for i, m := range msgs {
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: out, Values: m.Values})
			ids[i] = m.ID
		}
		pipe.XAck(ctx, in, group, ids...)
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("hop %s -> %s: %w", in, out, err)
		}
	}
}
