// Command flowbench measures flowrun against raw go-redis and against Watermill, on a private
// redis-server, in interleaved rounds, and prints the medians and the ratios of DESIGN.md's
// performance budgets.
//
//	flowbench -flowrun bin/flowrun            # the full run (make bench)
//	flowbench -flowrun bin/flowrun -quick     # every scenario briefly, no speed asserted (make bench-quick)
//	flowbench -flowrun bin/flowrun -profile DIR -pprof-bin bin/flowrun-pprof   # CPU profiles of FW-1 and FW-3
//
// Every system under test runs as a child process (flowrun is the bin/flowrun binary; the raw hops,
// the Watermill flows and the publishers are this binary started as `flowbench child ...`), so that
// the CPU time and peak memory reported are its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		if err := runChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "flowbench child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "flowbench:", err)
		os.Exit(1)
	}
}

// config are the counts and durations of a run.
type config struct {
	// The TAKEOVER scenario's (takeover.go): the lease TTL, the kills per round, and the rate
	// of the messages flowing meanwhile.
	takeoverTTL   time.Duration
	takeoverKills int
	takeoverRate  float64

	rounds     int
	warm       int           // warm-up messages
	latRate    float64       // paced rate of the latency phase, messages per second
	latDur     time.Duration // length of the latency phase
	flat       int           // flat-out messages
	wmFlat     int           // flat-out messages for Watermill, which is much slower
	flatCap    time.Duration // the flat-out phase ends after this even if not all arrived
	pub        int           // messages of the publish scenarios
	backlog    int           // messages waiting before the backlog scenario starts
	backlogCap time.Duration
	job        int  // messages of the whole job (FW-5 job, RAW-5 job)
	nexmark    int  // events the Nexmark generator makes for the NEXMARK scenarios (nexmark.go)
	quick      bool // -quick: the figures mean nothing, and no budget is judged
}

var (
	fullConfig = config{
		takeoverTTL: 3 * time.Second, takeoverKills: 4, takeoverRate: 3000,
		rounds: 3, warm: 2000, latRate: 5000, latDur: 5 * time.Second,
		flat: 200_000, wmFlat: 50_000, flatCap: 20 * time.Second, pub: 400_000,
		backlog: 2_000_000, backlogCap: 5 * time.Minute, job: 150_000, nexmark: 200_000,
	}
	quickConfig = config{
		takeoverTTL: time.Second, takeoverKills: 2, takeoverRate: 1000,
		rounds: 1, warm: 200, latRate: 5000, latDur: 400 * time.Millisecond,
		flat: 4000, wmFlat: 1000, flatCap: 15 * time.Second, pub: 8000,
		backlog: 40_000, backlogCap: 60 * time.Second, job: 5000, nexmark: 10_000, quick: true,
	}
)

// caps are the options of this flowrun binary that some scenarios need.
type caps struct {
	http      bool // flowrun run --http (metrics)
	traceFile bool // flowrun run --trace-file (tracing)
	version   string
}

type harness struct {
	cfg        config
	srv        *redisServer
	rdb        *goredis.Client
	flowrun    string
	pprofBin   string
	profileDir string
	self       string
	tmp        string
	pipelines  map[string]string
	caps       caps
	seq        int
	// wmConsumers is the number of subscribers per hop of the tuned Watermill scenarios.
	wmConsumers int
	// Experiments: flowrunEnv is added to flowrun's environment (GOGC=400, say); fwBatch > 0 runs
	// the flowrun flows in process with that runtime.Options.BatchSize instead of bin/flowrun.
	flowrunEnv []string
	fwBatch    int
	// The connectors' databases (connectors.go), made at first use, and what removes them.
	sqlDB    string
	pg       *privatePostgres
	nats     *benchNATS         // connectors_nats.go
	cluster  *redistest.Cluster // takeover.go
	cleanups []func()
}

func run() error {
	quick := flag.Bool("quick", false, "run every scenario briefly with small counts (asserts that everything works, nothing about speed)")
	flowrun := flag.String("flowrun", "bin/flowrun", "the flowrun binary (built from ./cmd/flowrun)")
	rounds := flag.Int("rounds", 0, "interleaved rounds (default 3, or 1 with -quick)")
	only := flag.String("only", "", "run only the scenarios whose name matches this regular expression")
	noBacklog := flag.Bool("no-backlog", false, "skip the backlog scenario")
	profile := flag.String("profile", "", "write CPU and allocation profiles of RAW-1, FW-1, RAW-3 and FW-3 flat out into this directory, and run nothing else")
	pprofBin := flag.String("pprof-bin", "bin/flowrun-pprof", "with -profile: flowrun built with the profiling wrapper (bench/cmd/flowrun-pprof)")
	mdOut := flag.String("md", "", "also write the report, in Markdown, to this file")
	keep := flag.Bool("keep", false, "keep the logs of the child processes")
	var flowrunEnv []string
	flag.Func("flowrun-env", "experiment: add `KEY=VALUE` to the environment of flowrun (repeatable), e.g. GOGC=400", func(s string) error {
		if !strings.Contains(s, "=") {
			return fmt.Errorf("want KEY=VALUE, not %q", s)
		}
		flowrunEnv = append(flowrunEnv, s)
		return nil
	})
	fwBatch := flag.Int("fw-batch", 0, "experiment: run the flowrun flows in process (runtime.Run, no metrics or tracing) with this runtime.Options.BatchSize")
	wmSubs := flag.Int("wm-consumers", wmConsumers, "subscribers per hop of the tuned (\"batched\") Watermill scenarios")
	flag.Parse()

	cfg := fullConfig
	if *quick {
		cfg = quickConfig
	}
	if *rounds > 0 {
		cfg.rounds = *rounds
	}
	var filter *regexp.Regexp
	if *only != "" {
		var err error
		if filter, err = regexp.Compile(*only); err != nil {
			return err
		}
	}
	h := &harness{cfg: cfg, flowrun: *flowrun, wmConsumers: max(*wmSubs, 1), flowrunEnv: flowrunEnv, fwBatch: *fwBatch}
	var err error
	if h.self, err = os.Executable(); err != nil {
		return err
	}
	if h.flowrun, err = exec.LookPath(h.flowrun); err != nil {
		return fmt.Errorf("the flowrun binary: %w (make build)", err)
	}
	if *profile != "" {
		h.profileDir = *profile
		h.cfg.flat = 500_000 // long enough for a few thousand samples of the slowest system
		h.cfg.flatCap = time.Minute
		if h.pprofBin, err = exec.LookPath(*pprofBin); err != nil {
			return fmt.Errorf("the profiling binary: %w", err)
		}
	}
	if h.caps, err = probe(h.flowrun); err != nil {
		return err
	}
	if h.tmp, err = os.MkdirTemp("", "flowbench-"); err != nil {
		return err
	}
	if h.pipelines, err = writePipelines(h.tmp); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		for i := len(h.cleanups) - 1; i >= 0; i-- {
			h.cleanups[i]()
		}
	}()
	if h.srv, err = startRedis(); err != nil {
		return err
	}
	defer h.srv.stop()
	h.rdb = goredis.NewClient(&goredis.Options{Addr: h.srv.addr(), PoolSize: 32})
	defer func() { _ = h.rdb.Close() }() // the harness is done

	m := describeMachine(ctx, h)
	fmt.Print(m.text())
	if *quick {
		fmt.Println("quick mode: every scenario once with small counts; the figures mean nothing")
	}

	if h.profileDir != "" {
		return h.runProfiles(ctx, filter)
	}

	results := map[string][]result{}
	failed := 0
	for round := 1; round <= cfg.rounds; round++ {
		for _, sc := range scenarios {
			if filter != nil && !filter.MatchString(sc.name) {
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r := h.run(ctx, sc)
			if r.failed != "" {
				failed++
			}
			results[sc.name] = append(results[sc.name], r)
			fmt.Printf("round %d  %s\n", round, progressLine(sc, r))
		}
	}
	if !*noBacklog && (filter == nil || filter.MatchString(backlogScenario.name)) && ctx.Err() == nil {
		r := h.run(ctx, backlogScenario)
		if r.failed != "" {
			failed++
		}
		results[backlogScenario.name] = []result{r}
		fmt.Printf("once     %s\n", progressLine(backlogScenario, r))
	}

	var costs costTable // costs.go
	if *costsFlag && ctx.Err() == nil {
		var n int
		costs, n = h.runCosts(ctx, filter)
		failed += n
	}

	rep := buildReport(m, cfg, results, *quick) + costs.report()
	fmt.Println()
	fmt.Print(rep)
	if *mdOut != "" {
		if err := os.WriteFile(*mdOut, []byte(rep), 0o644); err != nil {
			return err
		}
	}
	if *keep || failed > 0 {
		fmt.Println("logs of the child processes:", h.tmp)
	} else {
		_ = os.RemoveAll(h.tmp)
	}
	if failed > 0 {
		return fmt.Errorf("%d scenario run%s failed", failed, plural(failed))
	}
	return nil
}

// probe reads flowrun run --help for the options that some scenarios need.
func probe(bin string) (caps, error) {
	out, err := exec.Command(bin, "run", "--help").CombinedOutput()
	if err != nil {
		return caps{}, fmt.Errorf("%s run --help: %v: %s", bin, err, out)
	}
	help := string(out)
	c := caps{http: strings.Contains(help, "--http "), traceFile: strings.Contains(help, "--trace-file ")}
	if v, err := exec.Command(bin, "version").Output(); err == nil {
		c.version = strings.TrimSpace(strings.SplitN(string(v), "\n", 2)[0])
	}
	return c, nil
}

// profiledByDefault are the scenarios that -profile runs without -only.
var profiledByDefault = []string{"RAW-1", "FW-1", "RAW-3", "FW-3"}

// runProfiles runs RAW-1, FW-1, RAW-3 and FW-3 (or those -only picks) once with profiling on
// (flowrun through the profiling wrapper), which writes a CPU profile of the flat-out phase and
// allocation profiles.
func (h *harness) runProfiles(ctx context.Context, filter *regexp.Regexp) error {
	if err := os.MkdirAll(h.profileDir, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, sc := range scenarios {
		// By default the four flows of the budgets; -only picks any of the raw and flowrun flows and
		// publishers.
		picked := slices.Contains(profiledByDefault, sc.name)
		if filter != nil {
			picked = filter.MatchString(sc.name)
		}
		if !picked || sc.impl == implWatermill || sc.impl == implBenthos {
			continue
		}
		if err := os.MkdirAll(h.profilePath(sc), 0o755); err != nil {
			return err
		}
		r := h.run(ctx, sc)
		fmt.Printf("profile  %s\n", progressLine(sc, r))
		if r.failed != "" {
			errs = append(errs, fmt.Errorf("%s: %s", sc.name, r.failed))
			continue
		}
		cpu := filepath.Join(h.profilePath(sc), "cpu.pprof")
		if _, err := os.Stat(cpu); err != nil {
			errs = append(errs, fmt.Errorf("%s: ran, but its runner wrote no profile (%w)", sc.name, err))
			continue
		}
		fmt.Printf("         go tool pprof -top %s\n", cpu)
	}
	fmt.Println("logs of the child processes:", h.tmp)
	return errors.Join(errs...)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
