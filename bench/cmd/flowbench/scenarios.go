package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flowrun/flowrun/bench/internal/sigprof"
)

type kind int

const (
	kindPublish kind = iota // a publisher alone: messages per second into one stream
	kindHops                // input stream -> k hops -> final consumer
	kindBacklog             // FW-3 started on a backlog: peak RSS
)

type impl int

const (
	implRaw impl = iota
	implFlowrun
	implWatermill
	implBenthos // benthos.go
)

// scenario is one system under test with one configuration.
type scenario struct {
	name   string
	kind   kind
	impl   impl
	stages int
	vs     string // the scenario its rate is divided by, for the ratio column
	// trace is OTEL_TRACES_SAMPLER_ARG for flowrun with tracing (parentbased_traceidratio); ""
	// runs without tracing.
	trace    string
	pipeline string // flowrun: fw1, fw3 or fw3-eo
	// consumers is the number of Watermill subscribers per hop (0: one, with default settings).
	consumers int
	// async publishes with Publisher.Publish, one message at a time, instead of PublishBatch.
	async bool
	// counting is how the messages of a flow are counted as through.
	counting counting
	// Set by the scenarios of other files (benthos.go): the streams the harness writes and reads
	// (instead of streamsOf's), the start of the child process (instead of startSystem's), and
	// fewer: the flat-out phase has the Watermill count of messages.
	streams func() ([]string, format)
	start   func(h *harness, sc scenario, streams []string) (*child, error)
	fewer   bool
	// Set by the connectors' scenarios (connectors.go): the messages per HTTP request, and
	// Benthos's tuned set-up.
	lines int
	tuned bool
}

// counting says when a flow's messages are through. Every rate is of input messages: a stage that
// passes on fewer messages than it reads does not look faster or slower for it.
type counting int

const (
	// countArrivals: every message arrives at the final consumer.
	countArrivals counting = iota
	// countDistinct: the first message of each id arrives at the final consumer (a dedupe stage
	// drops the rest); a phase is through when its distinct messages have arrived.
	countDistinct
	// countAcks: the stage's acknowledgements of its input entries, read from its consumer group;
	// its outputs (an aggregate's: one per key and window) are not read, and it has no end-to-end
	// latency per message.
	countAcks
)

// hasLatency says whether the scenario's end-to-end latency is measured.
func (sc scenario) hasLatency() bool { return sc.kind == kindHops && sc.counting != countAcks }

// wmConsumers is the default number of subscribers per hop of the tuned Watermill set-up (flag
// -wm-consumers): with 4 and 8 the best of 2, 4, 8, 16 and 32 on the 2-core machine of
// BENCHMARKS.md.
const wmConsumers = 8

// scenarios are run in this order in every round, each next to what it is compared with.
var scenarios = []scenario{
	{name: "RAW-PUB", kind: kindPublish, impl: implRaw},
	{name: "publish", kind: kindPublish, impl: implFlowrun, vs: "RAW-PUB", pipeline: "fw1"},
	{name: "publish async", kind: kindPublish, impl: implFlowrun, vs: "RAW-PUB", pipeline: "fw1", async: true},
	{name: "RAW-1", kind: kindHops, impl: implRaw, stages: 1},
	{name: "FW-1", kind: kindHops, impl: implFlowrun, stages: 1, vs: "RAW-1", pipeline: "fw1"},
	{name: "FW-1 aggregate", kind: kindHops, impl: implFlowrun, stages: 1, vs: "FW-1", pipeline: "fw1-aggregate", counting: countAcks},
	{name: "FW-1 dedupe", kind: kindHops, impl: implFlowrun, stages: 1, vs: "FW-1", pipeline: "fw1-dedupe", counting: countDistinct},
	{name: "FW-1 lookup", kind: kindHops, impl: implFlowrun, stages: 1, vs: "FW-1", pipeline: "fw1-lookup"},
	{name: "FW-1 rate_limit", kind: kindHops, impl: implFlowrun, stages: 1, vs: "FW-1", pipeline: "fw1-rate-limit"},
	{name: "FW-1 join", kind: kindHops, impl: implFlowrun, stages: 1, vs: "FW-1", pipeline: "fw1-join"},
	{name: "RAW-3", kind: kindHops, impl: implRaw, stages: 3},
	{name: "FW-3", kind: kindHops, impl: implFlowrun, stages: 3, vs: "RAW-3", pipeline: "fw3"},
	{name: "FW-3 trace 1%", kind: kindHops, impl: implFlowrun, stages: 3, vs: "FW-3", pipeline: "fw3", trace: "0.01"},
	{name: "FW-3 trace 100%", kind: kindHops, impl: implFlowrun, stages: 3, vs: "FW-3", pipeline: "fw3", trace: "1"},
	{name: "FW-3 eo", kind: kindHops, impl: implFlowrun, stages: 3, vs: "FW-3", pipeline: "fw3-eo"},
	{name: "RAW-5 job", kind: kindJob, impl: implRaw, stages: jobHops},
	{name: "FW-5 job", kind: kindJob, impl: implFlowrun, stages: jobHops, vs: "RAW-5 job"},
	{name: "RAW-5 job 1k", kind: kindShortJob, impl: implRaw, stages: jobHops},
	{name: "FW-5 job 1k", kind: kindShortJob, impl: implFlowrun, stages: jobHops, vs: "RAW-5 job 1k"},
	{name: "Watermill-1 default", kind: kindHops, impl: implWatermill, stages: 1, vs: "RAW-1"},
	{name: "Watermill-1 batched", kind: kindHops, impl: implWatermill, stages: 1, vs: "RAW-1", consumers: wmConsumers},
	{name: "Watermill-3 default", kind: kindHops, impl: implWatermill, stages: 3, vs: "RAW-3"},
	{name: "Watermill-3 batched", kind: kindHops, impl: implWatermill, stages: 3, vs: "RAW-3", consumers: wmConsumers},
}

// backlogScenario runs once, after the rounds: its figure is a peak, not a rate to compare.
var backlogScenario = scenario{name: "FW-3 backlog 10x", kind: kindBacklog, impl: implFlowrun, stages: 3, pipeline: "fw3"}

// result is one run of one scenario.
type result struct {
	na     string // not available (yet): why
	failed string // what went wrong
	notes  []string

	rate     float64       // messages per second
	p50, p99 time.Duration // end-to-end latency at the paced rate
	cpu      float64       // ns of the system's CPU per message per stage
	redisCPU float64       // ns of redis-server's CPU per message per stage
	peakKB   int64         // the system's peak resident set
	got      int           // messages of the measured phase that arrived
	elapsed  time.Duration // of the measured phase
	capped   bool          // the phase ended on its time limit before all had arrived

	takeover *takeoverResult // the TAKEOVER scenario's figures (takeover.go), instead of the above
}

func (r result) ok() bool { return r.na == "" && r.failed == "" }

func (r *result) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// run runs one scenario once, on an empty Redis.
func (h *harness) run(ctx context.Context, sc scenario) result {
	if why := h.unavailable(sc); why != "" {
		return result{na: why}
	}
	if err := h.rdb.FlushAll(ctx).Err(); err != nil {
		return result{failed: "FLUSHALL: " + err.Error()}
	}
	switch sc.kind {
	case kindPublish:
		return h.runPublish(ctx, sc)
	case kindBacklog:
		return h.runBacklog(ctx, sc)
	case kindJob, kindShortJob:
		return h.runJob(ctx, sc)
	case kindHTTPIn, kindSQLOut, kindCDC:
		return h.connectorRun(ctx, sc)
	case kindAMQPIn, kindAMQPOut:
		return h.runAMQP(ctx, sc)
	case kindKafkaIn, kindKafkaOut:
		return h.runKafka(ctx, sc)
	case kindNATSIn, kindNATSOut:
		return h.natsRun(ctx, sc)
	case kindMQTTIn, kindMQTTOut:
		return h.mqttRun(ctx, sc)
	case kindNexmark:
		return h.runNexmark(ctx, sc)
	case kindTakeover:
		return h.runTakeover(ctx, sc)
	}
	return h.runHops(ctx, sc)
}

// unavailable says why a scenario cannot run with this flowrun binary, or "".
func (h *harness) unavailable(sc scenario) string {
	if sc.trace != "" && !h.caps.traceFile {
		return "not available yet: flowrun run has no --trace-file"
	}
	if sc.trace != "" && h.fwBatch > 0 {
		return "not with -fw-batch (no tracing in process)"
	}
	if why := kafkaUnavailable(sc); why != "" {
		return why
	}
	if sc.impl == implBenthos {
		return benthosUnavailable(h)
	}
	return ""
}

// streams returns the streams a scenario's messages go through and the entry format.
func streamsOf(sc scenario) ([]string, format) {
	if sc.streams != nil {
		return sc.streams()
	}
	if sc.impl == implFlowrun {
		var s []string
		for _, t := range fwTopics(sc.stages) {
			s = append(s, fwStream(t))
		}
		return s, formatPlain
	}
	prefix := "raw"
	f := formatPlain
	if sc.impl == implWatermill {
		prefix, f = "wm", formatWatermill
	}
	s := []string{prefix + ":{in}"}
	for i := 1; i <= sc.stages; i++ {
		s = append(s, fmt.Sprintf("%s:{h%d}", prefix, i))
	}
	return s, f
}

// logPath is where a child's standard error goes.
func (h *harness) logPath(sc scenario) string {
	h.seq++
	name := strings.NewReplacer(" ", "-", "%", "pct").Replace(sc.name)
	return filepath.Join(h.tmp, fmt.Sprintf("%03d-%s.log", h.seq, name))
}

// startSystem starts the child process of a flow scenario. For flowrun it also returns the address
// of its HTTP server ("" without one).
func (h *harness) startSystem(sc scenario, streams []string) (*child, string, error) {
	if sc.start != nil {
		c, err := sc.start(h, sc, streams)
		return c, "", err
	}
	switch sc.impl {
	case implRaw:
		var env []string
		if h.profileDir != "" {
			env = append(env, sigprof.EnvDir+"="+h.profilePath(sc))
		}
		c, err := startChild(sc.name, h.logPath(sc), env, h.self, "child", "raw-hops", "-addr", h.srv.addr(), "-streams", strings.Join(streams, ","))
		return c, "", err
	case implWatermill:
		consumers, pool := sc.consumers, 0
		if consumers > 0 {
			// Each subscriber holds a connection in its blocking read; its XACKs and its handler's
			// XADDs need more.
			consumers = h.wmConsumers
			pool = 4 * consumers * sc.stages
		}
		c, err := startChild(sc.name, h.logPath(sc), nil, h.self, "child", "watermill", "-addr", h.srv.addr(),
			"-streams", strings.Join(streams, ","), "-consumers", strconv.Itoa(consumers), "-pool", strconv.Itoa(pool))
		return c, "", err
	}
	env := append([]string(nil), h.flowrunEnv...)
	if h.fwBatch > 0 {
		c, err := startChild(sc.name, h.logPath(sc), env, h.self, "child", "fw-run", "-addr", h.srv.addr(),
			"-pipeline", h.pipelines[sc.pipeline], "-batch", strconv.Itoa(h.fwBatch))
		return c, "", err
	}
	args := []string{"run", h.pipelines[sc.pipeline], "--redis", h.srv.url()}
	httpAddr := ""
	if h.caps.http {
		port, err := freePort()
		if err != nil {
			return nil, "", err
		}
		httpAddr = "127.0.0.1:" + strconv.Itoa(port)
		args = append(args, "--http", httpAddr)
	}
	if sc.trace != "" {
		args = append(args, "--trace-file", os.DevNull)
		env = append(env, "OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG="+sc.trace)
	}
	bin := h.flowrun
	if h.profileDir != "" {
		bin = h.pprofBin
		env = append(env, sigprof.EnvDir+"="+h.profilePath(sc))
	}
	c, err := startChild(sc.name, h.logPath(sc), env, bin, args...)
	return c, httpAddr, err
}

// flowrunJob returns the binary and environment of a flowrun process that runs to its end (a job,
// a Nexmark query): with -profile, the profiling wrapper, which profiles the whole run. The raw
// q0 child profiles its work with the same environment.
func (h *harness) flowrunJob(sc scenario) (bin string, env []string) {
	if h.profileDir == "" {
		return h.flowrun, h.flowrunEnv
	}
	env = append(slices.Clip(h.flowrunEnv), sigprof.EnvDir+"="+h.profilePath(sc), sigprof.EnvWhole+"=1")
	return h.pprofBin, env
}

func (h *harness) profilePath(sc scenario) string {
	return filepath.Join(h.profileDir, strings.ToLower(strings.ReplaceAll(sc.name, " ", "-")))
}

// async runs f in a goroutine and delivers its error.
func async(f func() error) <-chan error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	return c
}

// runHops measures a flow: a warm-up, then end-to-end latency at a paced rate, then the rate flat
// out, with the CPU time and peak memory of the process that runs the hops.
func (h *harness) runHops(ctx context.Context, sc scenario) (res result) {
	streams, f := streamsOf(sc)
	in := streams[0]
	cons := &consumer{rdb: h.rdb, stream: streams[len(streams)-1]}
	if sc.counting != countAcks {
		if err := cons.create(ctx); err != nil {
			return result{failed: err.Error()}
		}
	}
	c, httpAddr, err := h.startSystem(sc, streams)
	if err != nil {
		return result{failed: err.Error()}
	}
	defer func() {
		if err := c.stop(30 * time.Second); err != nil && res.failed == "" {
			res.failed = "stopping: " + err.Error()
		}
	}()
	fail := func(phase string, err error) result {
		if c.exited() {
			return result{failed: fmt.Sprintf("%s: the process exited: %s", phase, c.logTail())}
		}
		return result{failed: fmt.Sprintf("%s: %v", phase, err)}
	}

	// through waits until the n messages of a phase are through the flow (as sc.counting says) or
	// the deadline passes, calling on (if not nil) with the publish time and arrival time of each
	// one that arrives. It returns how many of the n input messages are through, and when the last
	// of them were seen.
	acks := &ackCounter{rdb: h.rdb, stream: in, group: "s1"} // a stage's consumer group is named after it
	sent := 0                                                // messages published so far
	through := func(n int, phase byte, deadline time.Time, on func(ts int64, at time.Time)) (int, time.Time, error) {
		before := sent // the earlier phases', all through
		sent += n
		switch sc.counting {
		case countAcks:
			got, last, err := acks.wait(ctx, sent, deadline)
			return max(got-before, 0), last, err
		case countDistinct:
			got, last, err := cons.receive(ctx, distinct(n), phase, deadline, on)
			return inputsOf(got, n), last, err
		case countArrivals:
			return cons.receive(ctx, n, phase, deadline, on)
		}
		return 0, time.Time{}, fmt.Errorf("%s: unknown counting %d", sc.name, sc.counting)
	}

	// Warm-up: the process is up, its groups exist, its connections are open.
	pub := async(func() error { return publish(ctx, h.rdb, in, f, phaseWarm, 0, h.cfg.warm) })
	got, _, err := through(h.cfg.warm, phaseWarm, time.Now().Add(60*time.Second), nil)
	if err == nil {
		err = <-pub
	}
	if err == nil && got < h.cfg.warm {
		err = fmt.Errorf("only %d of %d messages were through within 60s", got, h.cfg.warm)
	}
	if err != nil {
		return fail("warm-up", err)
	}

	// Latency at a paced rate.
	latN := int(h.cfg.latRate * h.cfg.latDur.Seconds())
	lat := make([]time.Duration, 0, latN)
	pub = async(func() error { return publishPaced(ctx, h.rdb, in, f, phaseLatency, latN, h.cfg.latRate) })
	got, _, err = through(latN, phaseLatency, time.Now().Add(h.cfg.latDur+60*time.Second), func(ts int64, at time.Time) {
		lat = append(lat, at.Sub(time.Unix(0, ts)))
	})
	if err == nil {
		err = <-pub
	}
	if err == nil && got < latN {
		err = fmt.Errorf("only %d of %d messages were through", got, latN)
	}
	if err != nil {
		return fail("latency", err)
	}
	res.p50, res.p99 = percentile(lat, 0.50), percentile(lat, 0.99)

	// Flat out: the process is stopped (SIGSTOP) while n messages are published, then continued;
	// the rate is how fast the hops bring them to the final consumer. So the harness's publisher
	// competes with nobody, and every system drains the same backlog of the same size.
	n := h.cfg.flat
	if sc.impl == implWatermill || sc.fewer {
		n = h.cfg.wmFlat
	}
	if err := c.pause(); err != nil {
		return fail("flat out", err)
	}
	if err := publishParallel(ctx, h.rdb, in, f, phaseFlat, n, 4); err != nil {
		return fail("flat out", err)
	}
	cpu0, err := c.cpu()
	if err != nil {
		return fail("flat out", err)
	}
	rcpu0, err := h.srv.cpu()
	if err != nil {
		return fail("flat out", err)
	}
	t0 := time.Now()
	if err := c.signal(syscall.SIGCONT); err != nil {
		return fail("flat out", err)
	}
	if h.profileDir != "" && sc.impl != implWatermill {
		if err := c.signal(syscall.SIGUSR1); err != nil {
			return fail("profile", err)
		}
	}
	got, last, err := through(n, phaseFlat, t0.Add(h.cfg.flatCap), nil)
	end := time.Now()
	cpu1, cerr := c.cpu()
	rcpu1, rerr := h.srv.cpu()
	if err == nil {
		err = errors.Join(cerr, rerr)
	}
	if err != nil {
		return fail("flat out", err)
	}
	if h.profileDir != "" && sc.impl != implWatermill {
		if err := h.finishProfile(c, sc); err != nil {
			return fail("profile", err)
		}
	}
	if got == 0 {
		return fail("flat out", fmt.Errorf("nothing arrived within %s", h.cfg.flatCap))
	}
	res.got, res.elapsed = got, last.Sub(t0)
	if got < n {
		res.elapsed, res.capped = end.Sub(t0), true
	}
	res.rate = float64(got) / res.elapsed.Seconds()
	res.cpu = float64(cpu1-cpu0) / float64(got*sc.stages)
	res.redisCPU = float64(rcpu1-rcpu0) / float64(got*sc.stages)
	_, res.peakKB, _ = c.memKB()
	if res.rate < h.cfg.latRate {
		res.note("slower than the paced %.0f msg/s: its latency is mostly queueing", h.cfg.latRate)
	}
	if sc.impl == implFlowrun {
		h.noteOutcomes(ctx, sc, &res)
	}

	if httpAddr != "" {
		if err := scrape("http://" + httpAddr + "/metrics"); err != nil {
			return fail("metrics", err)
		}
	}
	return res
}

// noteOutcomes notes what should not happen in a flowrun flow: messages dead-lettered (a late
// event of an aggregate, say), or an aggregate that closed no window (expected only in quick mode,
// whose runs are shorter than its windows of 1s and grace of 1s).
func (h *harness) noteOutcomes(ctx context.Context, sc scenario, res *result) {
	if n, err := h.rdb.XLen(ctx, fwStream("failed")).Result(); err == nil && n > 0 {
		res.note("%d messages dead-lettered", n)
	}
	if n, err := h.rdb.XLen(ctx, fwStream("out")).Result(); err == nil && n == 0 && sc.counting == countAcks {
		res.note("no window closed during the run")
	}
}

// finishProfile stops the profiling wrapper's CPU profile and waits until it has written it.
func (h *harness) finishProfile(c *child, sc scenario) error {
	if err := c.signal(syscall.SIGUSR2); err != nil {
		return err
	}
	done := filepath.Join(h.profilePath(sc), "done")
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(done); err == nil {
			return nil
		}
	}
	return fmt.Errorf("no profile in %s", h.profilePath(sc))
}

// scrape checks that a metrics endpoint answers.
func scrape(url string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read to the end
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || len(body) == 0 {
		return fmt.Errorf("GET %s: %s, %d bytes", url, resp.Status, len(body))
	}
	return nil
}

// runPublish runs a publisher child and checks that everything it published is in Redis.
func (h *harness) runPublish(ctx context.Context, sc scenario) result {
	n := h.cfg.pub
	args := []string{"child", "pub-raw", "-addr", h.srv.addr(), "-n", strconv.Itoa(n), "-g", "4", "-stream", "raw:{pub}"}
	stream := "raw:{pub}"
	if sc.impl == implFlowrun {
		args = []string{"child", "pub-flowrun", "-addr", h.srv.addr(), "-n", strconv.Itoa(n), "-g", "4", "-pipeline", h.pipelines[sc.pipeline], "-topic", "in",
			"-async=" + strconv.FormatBool(sc.async)}
		stream = fwStream("in")
	}
	rcpu0, err := h.srv.cpu()
	if err != nil {
		return result{failed: err.Error()}
	}
	var env []string
	if h.profileDir != "" {
		env = append(env, sigprof.EnvDir+"="+h.profilePath(sc))
	}
	c, err := startChild(sc.name, h.logPath(sc), env, h.self, args...)
	if err != nil {
		return result{failed: err.Error()}
	}
	if err := c.wait(5 * time.Minute); err != nil {
		return result{failed: err.Error()}
	}
	rcpu1, err := h.srv.cpu()
	if err != nil {
		return result{failed: err.Error()}
	}
	var rep pubReport
	if err := json.Unmarshal(c.stdout.Bytes(), &rep); err != nil {
		return result{failed: fmt.Sprintf("reading the publisher's report %q: %v", c.stdout.String(), err)}
	}
	length, err := h.rdb.XLen(ctx, stream).Result()
	if err != nil {
		return result{failed: err.Error()}
	}
	if length != int64(n) {
		return result{failed: fmt.Sprintf("%s holds %d entries, not %d", stream, length, n)}
	}
	res := result{got: n, elapsed: time.Duration(rep.ElapsedNS), peakKB: rep.MaxRSSKB}
	res.rate = float64(n) / res.elapsed.Seconds()
	res.cpu = float64(rep.CPUNS) / float64(n)
	res.redisCPU = float64(rcpu1-rcpu0) / float64(n) // the child's start-up did not touch Redis
	return res
}

// runBacklog publishes ten times the flat-out count before FW-3 starts, then lets it work through
// the backlog, and reports its peak memory: a backlog must stay in Redis, not in the process.
func (h *harness) runBacklog(ctx context.Context, sc scenario) (res result) {
	streams, f := streamsOf(sc)
	cons := &consumer{rdb: h.rdb, stream: streams[len(streams)-1]}
	if err := cons.create(ctx); err != nil {
		return result{failed: err.Error()}
	}
	n := h.cfg.backlog
	if err := publishParallel(ctx, h.rdb, streams[0], f, phaseBacklog, n, 4); err != nil {
		return result{failed: err.Error()}
	}
	if mem, err := h.rdb.Info(ctx, "memory").Result(); err == nil {
		res.note("%d messages waiting, Redis used_memory %s", n, infoField(mem, "used_memory_human"))
	}
	t0 := time.Now()
	c, _, err := h.startSystem(sc, streams)
	if err != nil {
		return result{failed: err.Error()}
	}
	defer func() {
		if err := c.stop(30 * time.Second); err != nil && res.failed == "" {
			res.failed = "stopping: " + err.Error()
		}
	}()
	got, last, err := cons.receive(ctx, n, phaseBacklog, t0.Add(h.cfg.backlogCap), nil)
	if err != nil {
		return result{failed: err.Error()}
	}
	if got == 0 {
		return result{failed: "nothing arrived within " + h.cfg.backlogCap.String()}
	}
	res.got, res.elapsed = got, last.Sub(t0)
	if got < n {
		res.elapsed, res.capped = time.Since(t0), true
	}
	res.rate = float64(got) / res.elapsed.Seconds()
	_, res.peakKB, _ = c.memKB()
	return res
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}

// percentile returns the q-quantile of ds (nearest rank); it sorts ds.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}
