package flowtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/internal/embedded"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Options configure RunFile. The zero value runs every run with seed 0 and logs nothing.
type Options struct {
	// Seed seeds the jitter of retries and backoffs: the same seed replays the same delays.
	Seed int64
	// Run, when set, runs only the runs whose "FILE/RUN" name it matches; the runs before a
	// selected one still run (they set up its state), unless the selected one resets.
	Run *regexp.Regexp
	// Update rewrites the golden files of expect blocks (expect { file = ... }) with what arrived,
	// instead of comparing.
	Update bool
	// Log receives the pipeline's log (debug level); nil discards it.
	Log io.Writer
	// NoFusion runs every stage in a hop of its own (runtime.Options.NoFusion).
	NoFusion bool
}

// Timing of the pipeline in a test, on the virtual clock.
const (
	// testLeaseTTL is the pipeline's lease TTL: a crash step's successor takes over after it.
	testLeaseTTL = time.Minute
	// testBlock is how long an idle read waits before it reads again. Reads wake up at once for what
	// the test or the pipeline writes, so this only bounds how often idle readers look around.
	testBlock = time.Minute
	// drainLimit is how much virtual time a step without advance runs at most before it reports
	// that the pipeline does not drain: a sink whose downstream never answers keeps it busy for
	// ever, and every move of the clock costs real time (an hour is a few seconds). A step that
	// means to wait longer says so with advance.
	drainLimit = time.Hour
)

// harness runs the runs of one test file.
type harness struct {
	file   *testfile.File
	plan   *flow.Plan
	opts   Options
	log    *slog.Logger
	clock  *Clock
	server *embedded.Server
	live   *incarnation // the pipeline running now
	born   int          // incarnations started, for their process IDs and seeds

	captured *captures
	mocks    map[string]*mockFunc
	// answers are the override_sinks' canned answers, by sink: like the service they stand for,
	// they go on through a crash, and start again with a reset.
	answers map[string]*cannedAnswers
	// scope holds what the run that is running now mocks and overrides itself, in place of the
	// file's. The pipeline's goroutines read it, the harness sets it between runs.
	scope struct {
		sync.Mutex
		mocks   map[string]*mockFunc
		answers map[string]*cannedAnswers
	}
	// drops are the messages that stateful stages dropped, in order (runtime.Options.Dropped).
	drops struct {
		sync.Mutex
		list []Dropped
	}
	// mocked and overridden are the functions and sinks that the file or one of its runs mocks or
	// overrides: their nodes look up, call by call, what stands in for them now.
	mocked, overridden map[string]bool
	// feeds are what the runs sent to the producing sources, by source name.
	feeds map[string]*feed
	// streamSources are the redis_stream sources, by name: what a run sends them goes into their
	// streams.
	streamSources map[string]stages.StreamSource
	// finished are the counters of the incarnations that ended (crashed), by "type.name".
	finished map[string]counters
}

// incarnation is one process's worth of pipeline: its runtime on its own connections, so that a
// crash can cut them as a SIGKILL would.
type incarnation struct {
	client   *redis.Client
	rt       *runtime.Runtime
	activity *runtime.Activity
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned
	summary  *runtime.Summary
	err      error
}

// RunFile runs the runs of a checked test file against plan, the pipeline compiled with the file's
// variables, and returns a result per run that ran (in file order).
func RunFile(ctx context.Context, file *testfile.File, plan *flow.Plan, opts Options) []*RunResult {
	plan.UnfuseTopics(file.Topics()) // a link of a chain that the file names must be a stream
	h := &harness{file: file, plan: plan, opts: opts, captured: newCaptures(), mocks: map[string]*mockFunc{},
		finished: map[string]counters{}}
	logTo := opts.Log
	if logTo == nil {
		logTo = io.Discard
	}
	h.log = slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.mocked, h.overridden = map[string]bool{}, map[string]bool{}
	for _, m := range file.AllMocks() {
		h.mocked[m.Func] = true
	}
	for _, m := range file.Mocks {
		h.mocks[m.Func] = &mockFunc{mock: m}
	}
	for _, o := range file.Overrides {
		h.overridden[o.Sink] = true
	}
	for _, r := range file.Runs {
		for _, o := range r.Overrides {
			h.overridden[o.Sink] = true
		}
	}
	defer h.stop(ctx)

	selected := h.selected()
	var results []*RunResult
	for i, run := range file.Runs {
		if !h.needed(i, selected) {
			continue
		}
		res := &RunResult{File: file.Path, Run: run.Name, Seed: opts.Seed}
		start := time.Now()
		if h.live == nil || run.Reset {
			if err := h.reset(ctx); err != nil {
				res.Err = err
				results = append(results, res)
				break
			}
		}
		virtualStart := h.clock.Now()
		h.enterRun(run)
		h.execute(ctx, run, res)
		h.enterRun(nil)
		res.Wall, res.Virtual = time.Since(start), h.clock.Now().Sub(virtualStart)
		if selected[i] {
			results = append(results, res)
		}
		if res.Err != nil {
			// What ran after would run on a pipeline in an unknown state: start the next one afresh.
			h.stop(ctx)
		}
	}
	return results
}

// selected reports, per run, whether Options.Run selects it.
func (h *harness) selected() []bool {
	sel := make([]bool, len(h.file.Runs))
	for i, run := range h.file.Runs {
		sel[i] = h.opts.Run == nil || h.opts.Run.MatchString(h.file.Path+"/"+run.Name)
	}
	return sel
}

// needed reports whether run i must run: it is selected, or a later selected run builds on it.
func (h *harness) needed(i int, selected []bool) bool {
	if selected[i] {
		return true
	}
	for j := i + 1; j < len(selected); j++ {
		if h.file.Runs[j].Reset {
			return false
		}
		if selected[j] {
			return true
		}
	}
	return false
}

// reset starts afresh: an empty Redis on a new clock, and a new pipeline on them.
func (h *harness) reset(ctx context.Context) error {
	h.stop(ctx)
	h.clock = NewClock(Epoch)
	server, err := embedded.StartAt(Epoch)
	if err != nil {
		return err
	}
	h.server = server
	h.clock.OnAdvance(server.SetTime)
	h.captured = newCaptures()
	h.finished = map[string]counters{}
	h.drops.Lock()
	h.drops.list = nil
	h.drops.Unlock()
	h.answers = map[string]*cannedAnswers{}
	h.feeds, h.streamSources = map[string]*feed{}, map[string]stages.StreamSource{}
	for _, s := range h.plan.Sources {
		if kind, err := stages.SourceKindOf(s); err == nil && kind.Stream != nil {
			h.streamSources[s.Name] = kind.Stream(s)
		} else {
			h.feeds[s.Name] = newFeed()
		}
	}
	for _, o := range h.file.Overrides {
		h.answers[o.Sink] = &cannedAnswers{responses: o.Responses}
	}
	for _, m := range h.mocks {
		m.calls = 0
	}
	return h.start(ctx)
}

// start starts a new incarnation of the pipeline, on connections of its own.
func (h *harness) start(ctx context.Context) error {
	h.born++
	client, err := redis.Open(ctx, redis.Options{URLs: []string{h.server.URL()}})
	if err != nil {
		return fmt.Errorf("connecting to the embedded Redis: %w", err)
	}
	client = client.WithClock(redisClock{h.clock}).WithClockedReads()
	inc := &incarnation{client: client, activity: &runtime.Activity{}, done: make(chan struct{})}
	rt, err := runtime.New(h.plan, runtime.Options{
		Redis:          client,
		Clock:          h.clock,
		NoFusion:       h.opts.NoFusion,
		LeaseTTL:       testLeaseTTL,
		Block:          testBlock,
		RetryPoll:      testBlock,      // nobody else schedules retries: a unit knows when its own are due
		SampleInterval: testBlock,      // the rates of the live page are not needed
		PollInterval:   24 * time.Hour, // the snapshot's stream state is not needed: counters are live
		Stdin:          strings.NewReader(""),
		Stdout:         io.Discard,
		HTTPClient:     &http.Client{Transport: noNetwork{}},
		Logger:         h.log,
		ProcessID:      fmt.Sprintf("flowtest-%d", h.born),
		Rand:           rand.New(rand.NewPCG(uint64(h.opts.Seed), uint64(h.born))),
		Activity:       inc.activity,
		NodeEnv:        h.nodeEnv,
		WrapSink:       h.wrapSink,
		Dropped:        h.recordDropped,
		WrapSource:     func(name string, _ stages.Source) stages.Source { return feedSource{h.feeds[name]} },
		PipelinePath:   h.file.Path,
	})
	if err != nil {
		_ = client.Close()
		return err
	}
	inc.rt = rt
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	inc.cancel = cancel
	before := h.clock.Changes()
	go func() {
		defer close(inc.done)
		inc.summary, inc.err = rt.Run(runCtx)
	}()
	h.live = inc
	// A run that has started has armed its tickers: until then, the goroutine that runs it may
	// not even have been scheduled, and the pipeline would look idle.
	for h.clock.Changes() == before {
		select {
		case <-inc.done:
			return h.failed()
		case <-time.After(settlePause):
		}
	}
	h.settle()
	return nil
}

// stop stops the pipeline, as a SIGTERM would, and the embedded Redis.
func (h *harness) stop(ctx context.Context) {
	if h.live != nil {
		h.live.cancel()
		h.driveUntilDone(ctx, h.live)
		_ = h.live.client.Close()
		h.live = nil
	}
	if h.server != nil {
		h.server.Close()
		h.server = nil
	}
}

// crash kills the pipeline as a SIGKILL would: its connections go first, so that it can neither
// acknowledge nor release anything more; then a new incarnation starts, which takes the dead one's
// partitions over once their leases expire on the clock.
func (h *harness) crash(ctx context.Context) error {
	dead := h.live
	h.log.Info("flowtest: crash: the process is killed, its connections first; what it logs while it dies, it does not get to do")
	_ = dead.client.Close()
	dead.cancel()
	h.driveUntilDone(ctx, dead)
	for name, c := range countersOf(dead.rt.Snapshot().Nodes) {
		h.finished[name] = h.finished[name].plus(c)
	}
	h.live = nil
	return h.start(ctx)
}

// driveUntilDone moves the clock on until inc's Run has returned (its shutdown may wait for timers).
func (h *harness) driveUntilDone(ctx context.Context, inc *incarnation) {
	for {
		select {
		case <-inc.done:
			return
		default:
		}
		h.settle()
		select {
		case <-inc.done:
			return
		case <-ctx.Done():
			return
		default:
		}
		if next, ok := h.clock.Next(); ok {
			h.clock.AdvanceTo(next)
		}
	}
}

// enterRun makes run's own mocks and override_sinks stand in, in place of the file's, until the
// next call (nil: the run is over). Each starts afresh with its run.
func (h *harness) enterRun(run *testfile.Run) {
	h.scope.Lock()
	defer h.scope.Unlock()
	h.scope.mocks, h.scope.answers = nil, nil
	if run == nil {
		return
	}
	for _, m := range run.Mocks {
		if h.scope.mocks == nil {
			h.scope.mocks = map[string]*mockFunc{}
		}
		h.scope.mocks[m.Func] = &mockFunc{mock: m}
	}
	for _, o := range run.Overrides {
		if h.scope.answers == nil {
			h.scope.answers = map[string]*cannedAnswers{}
		}
		h.scope.answers[o.Sink] = &cannedAnswers{responses: o.Responses}
	}
}

// mockOf returns what stands in for the function fn now: the running run's mock, else the file's;
// nil when neither mocks it.
func (h *harness) mockOf(fn string) *mockFunc {
	h.scope.Lock()
	defer h.scope.Unlock()
	if m, ok := h.scope.mocks[fn]; ok {
		return m
	}
	return h.mocks[fn]
}

// answersOf returns the canned answers of the sink now: the running run's override_sink, else the
// file's; nil when neither overrides it.
func (h *harness) answersOf(sink string) *cannedAnswers {
	h.scope.Lock()
	defer h.scope.Unlock()
	if a, ok := h.scope.answers[sink]; ok {
		return a
	}
	return h.answers[sink]
}

// nodeEnv gives http sinks with an override_sink their canned answers and go stages their mocks,
// looked up at each request and call, since a run may override them for itself.
func (h *harness) nodeEnv(typ, name string, env *stages.Env) {
	if typ == "sink" && h.overridden[name] {
		env.HTTPClient = &http.Client{Transport: sinkAnswers{h: h, sink: name}}
	}
	if typ == "stage" && len(h.mocked) > 0 {
		env.Functions = func(fn string) (stages.Func, bool) {
			if !h.mocked[fn] {
				return stages.Lookup(fn)
			}
			registered, hasReal := stages.Lookup(fn)
			return func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
				if mock := h.mockOf(fn); mock != nil {
					return mock.call(ctx, m)
				}
				if hasReal {
					return registered(ctx, m)
				}
				why := "this binary does not have it"
				if _, stateful := stages.LookupStateful(fn); stateful {
					why = "it is stateful, and its stage runs the mock, which keeps no state, in every run"
				}
				return nil, stages.Permanent(fmt.Errorf("flowrun test: function %q is mocked only in other runs, and %s: "+
					"mock it in this run too, or for the whole file", fn, why))
			}, true
		}
	}
}

// wrapSink puts the capture in front of every sink: alone, or with the real sink behind it where it
// writes only where the test can see (an http sink with canned answers, a sink that writes to
// Redis streams, whose kind lists them: SinkKind.Streams).
func (h *harness) wrapSink(name string, made stages.Sink) stages.Sink {
	c := &captureSink{name: "sink." + name, store: h.captured}
	for _, s := range h.plan.Sinks {
		if s.Name != name {
			continue
		}
		kind, err := stages.SinkKindOf(s)
		switch {
		case err == nil && kind.Streams != nil:
			c.behind = made
		case h.overridden[name]:
			// Behind the capture only while the file or the running run overrides it.
			c.behind, c.behindNow = made, func() bool { return h.answersOf(name) != nil }
		}
	}
	return c
}

// redisClock gives transport/redis the virtual clock.
type redisClock struct{ *Clock }

func (c redisClock) NewTimer(d time.Duration) redis.Timer { return c.Clock.NewTimer(d) }
