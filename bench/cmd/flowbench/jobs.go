package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The job scenarios run a whole job as a user runs one: a stream filled beforehand, five hops, and
// the whole `flowrun run --until-drained` process timed from exec to exit, against the same five
// hops in plain go-redis timed from the start of their process to the arrival of the last message.
//
// The flowrun job is a redis_stream source reading jobIn into a topic, three filter stages (each
// passes every message: amount is 1000 or more), every topic with 4 partitions keyed by msg.key,
// and a redis_stream sink writing jobOut. The raw job is RAW-k's loop over five hops, jobIn ->
// raw:{h1} ... raw:{h4} -> jobOut: it forwards without decoding, keying or evaluating anything.

// The kinds of the job scenarios (scenario.kind): the whole job of config.job messages, and the
// short job of shortJob messages.
const (
	kindJob kind = iota + 100
	kindShortJob
)

const (
	jobIn  = "job:{in}"
	jobOut = "job:{out}"
	// shortJob is the number of messages of the short job: the fixed cost of a job (start-up,
	// the end test, shutdown) is most of its time.
	shortJob = 1000
	// jobHops counts the source, the three stages and the sink.
	jobHops = 5
	// phaseJob marks the job scenarios' messages (see payload.go).
	phaseJob = 'j'
	// jobPipelineName names the job pipeline in harness.pipelines.
	jobPipelineName = "job5"
)

// jobPipelineHCL is the flowrun side of the job scenarios.
func jobPipelineHCL() string {
	var b strings.Builder
	b.WriteString("# Written by flowbench: the job of the job scenarios.\n")
	fmt.Fprintf(&b, "pipeline \"job\" {\n  key_prefix = %q\n}\n\n", fwPrefix)
	fmt.Fprintf(&b, "source \"in\" {\n  kind   = \"redis_stream\"\n  stream = %q\n  output = topic.t0\n}\n\n", jobIn)
	for i := range 4 {
		fmt.Fprintf(&b, "topic \"t%d\" {\n  partitions = 4\n  key        = msg.key\n}\n\n", i)
	}
	for i := 1; i <= 3; i++ {
		fmt.Fprintf(&b, "stage \"f%d\" {\n  kind   = \"filter\"\n  input  = topic.t%d\n  output = topic.t%d\n  where  = msg.amount >= 1000\n}\n\n", i, i-1, i)
	}
	fmt.Fprintf(&b, "sink \"out\" {\n  kind   = \"redis_stream\"\n  input  = topic.t3\n  stream = %q\n}\n", jobOut)
	return b.String()
}

// jobTiming is what a flowrun job's log says of where its time went.
type jobTiming struct {
	wall, startup, shutdown time.Duration // exec to exit; exec to "pipeline starting"; "all work done" to exit
}

// jobTimings are the timings of the flowrun job runs, by scenario, in the order of the rounds.
var jobTimings = map[string][]jobTiming{}

// rawJobWalls are the wall times of the raw job runs, by scenario.
var rawJobWalls = map[string][]time.Duration{}

// runJob runs a job scenario once: fill the input stream, then run the job.
func (h *harness) runJob(ctx context.Context, sc scenario) (res result) {
	n := h.cfg.job
	if sc.kind == kindShortJob {
		n = shortJob
	}
	if err := publishParallel(ctx, h.rdb, jobIn, formatPlain, phaseJob, n, 4); err != nil {
		return result{failed: err.Error()}
	}
	rcpu0, err := h.srv.cpu()
	if err != nil {
		return result{failed: err.Error()}
	}
	if sc.impl == implFlowrun {
		res = h.runFlowrunJob(ctx, sc, n)
	} else {
		res = h.runRawJob(ctx, sc, n)
	}
	if !res.ok() {
		return res
	}
	rcpu1, err := h.srv.cpu()
	if err != nil {
		return result{failed: err.Error()}
	}
	res.got = n
	res.rate = float64(n) / res.elapsed.Seconds()
	res.redisCPU = float64(rcpu1-rcpu0) / float64(n*jobHops)
	return res
}

// runFlowrunJob times `flowrun run --until-drained` from exec to exit and checks that every
// message reached the sink's stream.
func (h *harness) runFlowrunJob(ctx context.Context, sc scenario, n int) result {
	path, ok := h.pipelines[jobPipelineName]
	if !ok {
		path = filepath.Join(h.tmp, jobPipelineName+".hcl")
		if err := os.WriteFile(path, []byte(jobPipelineHCL()), 0o644); err != nil {
			return result{failed: err.Error()}
		}
		h.pipelines[jobPipelineName] = path
	}
	logPath := h.logPath(sc)
	t0 := time.Now()
	bin, env := h.flowrunJob(sc)
	c, err := startChild(sc.name, logPath, env, bin, "run", "--until-drained", path, "--redis", h.srv.url())
	if err != nil {
		return result{failed: err.Error()}
	}
	if err := c.wait(10 * time.Minute); err != nil {
		return result{failed: err.Error()}
	}
	wall := time.Since(t0)
	length, err := h.rdb.XLen(ctx, jobOut).Result()
	if err != nil {
		return result{failed: err.Error()}
	}
	if length != int64(n) {
		return result{failed: fmt.Sprintf("%s holds %d entries after the job, not %d; %s", jobOut, length, n, c.logTail())}
	}
	res := result{elapsed: wall, peakKB: c.maxRSSKB()}
	if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.cpu = float64(ru.Utime.Nano()+ru.Stime.Nano()) / float64(n*jobHops)
	}
	timing := jobTiming{wall: wall}
	if starting, done, err := jobLogTimes(logPath); err == nil {
		timing.startup, timing.shutdown = starting.Sub(t0), t0.Add(wall).Sub(done)
		res.note("start-up %s, shutdown %s", ms(timing.startup), ms(timing.shutdown))
	} else {
		res.note("no timings in the log: %v", err)
	}
	jobTimings[sc.name] = append(jobTimings[sc.name], timing)
	return res
}

// jobLogTimes reads from a flowrun job's log when it logged "pipeline starting" and "all work
// done" (text format: time=2026-12-01T20:41:54.287Z level=INFO msg="..."; milliseconds).
func jobLogTimes(path string) (starting, done time.Time, err error) {
	f, err := os.Open(path)
	if err != nil {
		return starting, done, err
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		ts, rest, ok := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if !ok {
			continue
		}
		var dst *time.Time
		switch {
		case strings.Contains(rest, `msg="pipeline starting"`):
			dst = &starting
		case strings.Contains(rest, `msg="all work done"`):
			dst = &done
		default:
			continue
		}
		if *dst, err = time.Parse(time.RFC3339Nano, ts); err != nil {
			return starting, done, err
		}
	}
	if starting.IsZero() || done.IsZero() {
		return starting, done, fmt.Errorf("%s lacks \"pipeline starting\" or \"all work done\"", path)
	}
	return starting, done, sc.Err()
}

// runRawJob times the raw hops from the start of their process to the arrival of the last
// message at the end of the fifth hop.
func (h *harness) runRawJob(ctx context.Context, sc scenario, n int) (res result) {
	streams := []string{jobIn}
	for i := 1; i < jobHops; i++ {
		streams = append(streams, fmt.Sprintf("raw:{h%d}", i))
	}
	streams = append(streams, jobOut)
	cons := &consumer{rdb: h.rdb, stream: jobOut}
	if err := cons.create(ctx); err != nil {
		return result{failed: err.Error()}
	}
	t0 := time.Now()
	c, err := startChild(sc.name, h.logPath(sc), nil, h.self, "child", "raw-hops", "-addr", h.srv.addr(), "-streams", strings.Join(streams, ","))
	if err != nil {
		return result{failed: err.Error()}
	}
	defer func() {
		if err := c.stop(30 * time.Second); err != nil && res.failed == "" {
			res.failed = "stopping: " + err.Error()
		}
	}()
	got, last, err := cons.receive(ctx, n, phaseJob, t0.Add(10*time.Minute), nil)
	if err == nil && got < n {
		err = fmt.Errorf("only %d of %d messages arrived", got, n)
	}
	if err != nil {
		if c.exited() {
			return result{failed: "the process exited: " + c.logTail()}
		}
		return result{failed: err.Error()}
	}
	cpu, err := c.cpu()
	if err != nil {
		return result{failed: err.Error()}
	}
	_, peak, _ := c.memKB()
	res = result{elapsed: last.Sub(t0), cpu: float64(cpu) / float64(n*jobHops), peakKB: peak}
	rawJobWalls[sc.name] = append(rawJobWalls[sc.name], res.elapsed)
	return res
}

// jobBudgets are the aims of issue 15 for jobs, judged on the medians of the rounds.
func jobBudgets(cfg config, sums map[string]summary) [][3]string {
	var rows [][3]string
	fw, ok1 := sums["FW-5 job"]
	raw, ok2 := sums["RAW-5 job"]
	have := ok1 && ok2 && fw.ratioRounds > 0
	measured := "n/a"
	if have {
		measured = fmt.Sprintf("%.2f (flowrun %s, raw %s)", fw.ratio, ms(medianOf(jobWalls("FW-5 job"))), ms(medianOf(rawJobWalls["RAW-5 job"])))
	}
	rows = append(rows, [3]string{fmt.Sprintf("FW-5 job (%d messages, the whole `flowrun run --until-drained`, exec to exit) >= 0.90 of RAW-5 job (aim, issue 15)", cfg.job),
		measured, verdict(have, fw.ratio >= 0.90)})

	have = ok1 && ok2 && fw.ok > 0 && raw.ok > 0
	measured = "n/a"
	own := fw.cpu - raw.cpu
	if have {
		measured = fmt.Sprintf("%+.2f us (flowrun %.2f us, raw %.2f us)", own/1000, fw.cpu/1000, raw.cpu/1000)
	}
	rows = append(rows, [3]string{"FW-5 job Go CPU per message per hop within 1.5 us of RAW-5 job's (aim, issue 15)", measured, verdict(have, own <= 1500)})

	walls := jobWalls("FW-5 job 1k")
	have = len(walls) > 0
	measured = "n/a"
	wall := medianOf(walls)
	if have {
		measured = fmt.Sprintf("%s (raw %s)", ms(wall), ms(medianOf(rawJobWalls["RAW-5 job 1k"])))
	}
	rows = append(rows, [3]string{fmt.Sprintf("FW-5 job 1k (%d messages, exec to exit) <= 150 ms (aim, issue 15)", shortJob), measured, verdict(have, wall <= 150*time.Millisecond)})

	var downs, ups []time.Duration
	for _, t := range jobTimings["FW-5 job 1k"] {
		if t.shutdown > 0 {
			downs, ups = append(downs, t.shutdown), append(ups, t.startup)
		}
	}
	have = len(downs) > 0
	measured = "n/a"
	down := medianOf(downs)
	if have {
		measured = fmt.Sprintf("%s (start-up, exec to \"pipeline starting\": %s)", ms(down), ms(medianOf(ups)))
	}
	rows = append(rows, [3]string{"FW-5 job 1k shutdown, \"all work done\" to exit (log times, to the millisecond) <= 20 ms (aim, issue 15)", measured, verdict(have, down <= 20*time.Millisecond)})
	return rows
}

func jobWalls(name string) []time.Duration {
	var ds []time.Duration
	for _, t := range jobTimings[name] {
		ds = append(ds, t.wall)
	}
	return ds
}

func medianOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return medianDur(ds)
}
