package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	_ "github.com/flowrun/flowrun/internal/teststages" // test.call, also in testdata/flowrun-shutdown
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A stop with work in flight, and the end of a job with work left.
//
// Each shutdown test stops a pipeline, by SIGTERM to a flowrun process or by canceling the context
// of Runtime.Run, while it has messages in flight: deliveries held by a slow http service, a
// message waiting in the process for its retry, messages paused at a node's circuit breaker. It then
// reads what the stop left in Redis, message by message: a message finished before or during the
// drain is acknowledged, one the stop abandoned is pending (not acknowledged, not dead-lettered, not
// in the retry set), and the rest is unread. Then it runs the pipeline again as a job, which must
// deliver every message, and none twice (except, after a drain timeout, what the stop had
// delivered and not yet acknowledged).

// answer is what the controller does with a request.
type answer int

const (
	answerAccept answer = iota
	answerHold          // wait until released, then accept; a request whose client gives up meanwhile is not accepted
	answerFail          // 500: a failure that the stage's retry policy retries
	answerAway          // 503: a transient failure (the service is away), which pauses the node
)

// controller is the HTTP service that the shutdown tests deliver to (an http sink) or call (the
// Go stage test.call). Its rule decides, by message number (field i), how many requests for that
// message came so far (the first is 1) and how many messages it accepted, what it answers.
type controller struct {
	url     string
	release chan struct{}
	once    sync.Once

	mu          sync.Mutex
	rule        func(i, request, accepted int) answer
	requests    map[int]int
	accepted    map[int]int
	order       map[string][]int // accepted messages by key, in the order they came
	held        map[int]bool     // messages whose request is being held now
	unavailable int              // 503 answers
}

func newController(t *testing.T, rule func(i, request, accepted int) answer) *controller {
	t.Helper()
	c := &controller{release: make(chan struct{}), rule: rule,
		requests: map[int]int{}, accepted: map[int]int{}, order: map[string][]int{}, held: map[int]bool{}}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	t.Cleanup(c.releaseHeld) // before srv.Close, which waits for the handlers
	c.url = srv.URL
	return c
}

func (c *controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var m struct {
		I int
		K string
	}
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// Read to the end: only then does the server notice that the client went away.
	_, _ = io.Copy(io.Discard, r.Body)
	c.mu.Lock()
	c.requests[m.I]++
	switch c.rule(m.I, c.requests[m.I], len(c.accepted)) {
	case answerHold:
		c.held[m.I] = true
		c.mu.Unlock()
		select {
		case <-c.release:
		case <-r.Context().Done():
		}
		c.mu.Lock()
		delete(c.held, m.I)
		if r.Context().Err() != nil {
			c.mu.Unlock()
			return // the client gave up: not delivered
		}
	case answerFail:
		c.mu.Unlock()
		http.Error(w, "failing", http.StatusInternalServerError)
		return
	case answerAway:
		c.unavailable++
		c.mu.Unlock()
		http.Error(w, "away", http.StatusServiceUnavailable)
		return
	}
	c.accepted[m.I]++
	c.order[m.K] = append(c.order[m.K], m.I)
	c.mu.Unlock()
}

// releaseHeld lets every held request go, and those to come: hold then means accept.
func (c *controller) releaseHeld() { c.once.Do(func() { close(c.release) }) }

func (c *controller) setRule(rule func(i, request, accepted int) answer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rule = rule
}

func acceptAll(int, int, int) answer { return answerAccept }

// controllerState is a copy of what a controller saw.
type controllerState struct {
	requests, accepted map[int]int
	order              map[string][]int
	held               map[int]bool
	unavailable        int
}

func (c *controller) state() controllerState {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := controllerState{requests: map[int]int{}, accepted: map[int]int{}, order: map[string][]int{},
		held: map[int]bool{}, unavailable: c.unavailable}
	for i, n := range c.requests {
		s.requests[i] = n
	}
	for i, n := range c.accepted {
		s.accepted[i] = n
	}
	for k, seq := range c.order {
		s.order[k] = slices.Clone(seq)
	}
	for i := range c.held {
		s.held[i] = true
	}
	return s
}

// shutdownEnv is a pipeline written to a file, with a key prefix of its own, on the shared
// redis-server.
type shutdownEnv struct {
	c    *redis.Client // the test's own connection
	url  string
	path string
	plan *flow.Plan
	keys redis.Keys
	// opts is what an in-process run sets on top of the defaults.
	opts runtime.Options
}

func newShutdownEnv(t *testing.T, pipeline func(prefix string) string) *shutdownEnv {
	t.Helper()
	url := redistest.Shared(t).URL()
	prefix := fmt.Sprintf("shutdown-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "pipeline.hcl")
	writeFile(t, path, pipeline(prefix))
	plan, _, diags := flow.Build(path, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return &shutdownEnv{c: openURLs(t, url), url: url, path: path, plan: plan, keys: redis.Keys{Prefix: prefix}}
}

// httpSinkPipeline delivers topic in (4 partitions, keyed) to an http sink.
func httpSinkPipeline(url string) func(prefix string) string {
	return func(prefix string) string {
		return fmt.Sprintf(`
pipeline "shutdown" {
  key_prefix = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
sink "hook" {
  kind    = "http"
  input   = topic.in
  url     = %q
  timeout = "5m"
}
`, prefix, url)
	}
}

// callStagePipeline runs topic in (4 partitions, keyed) through the Go stage test.call, with the
// given attributes, into a stream. The retry policy later retries failures after an hour.
func callStagePipeline(attributes string) func(prefix string) string {
	return func(prefix string) string {
		return fmt.Sprintf(`
pipeline "shutdown" {
  key_prefix = %q
}
retry "later" {
  max_attempts = 3
  backoff      = "constant"
  initial      = "1h"
  max          = "1h"
}
topic "in" {
  partitions = 4
  key        = msg.k
}
topic "done" {
  partitions = 4
  key        = msg.k
}
stage "work" {
  kind   = "go"
  func   = "test.call"
  input  = topic.in
  output = topic.done
  %s
}
sink "out" {
  kind   = "redis_stream"
  input  = topic.done
  stream = "%s:out"
}
`, prefix, attributes, prefix)
	}
}

// publishCalls publishes messages from..to-1 to topic in, keyed over 40 keys, each with its
// number and the URL that test.call calls.
func publishCalls(t *testing.T, env *shutdownEnv, from, to int, url string) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(env.c, env.plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		m := stages.NewMessage("", []byte(fmt.Sprintf(`{"k":"k%d","i":%d,"url":%q}`, i%40, i, url)), nil)
		if err := pub.Publish(ctx, "in", m); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// stoppable is a pipeline running as a service, to be stopped.
type stoppable struct {
	log *syncBuffer
	// stop asks the run to stop, and returns once it has begun to.
	stop func(t *testing.T)
	// wait returns the run's result, once it has ended.
	wait func(t *testing.T) error
}

// stopKind is a way to run a pipeline and stop it.
type stopKind struct {
	name string
	// start runs env's pipeline as a service, with a drain timeout (0: the default).
	start func(t *testing.T, env *shutdownEnv, drain time.Duration) *stoppable
	// job runs env's pipeline as a job until all its work is done.
	job func(t *testing.T, env *shutdownEnv)
}

// sigterm runs flowrun processes, and stops them with SIGTERM.
var sigterm = stopKind{
	name: "sigterm",
	start: func(t *testing.T, env *shutdownEnv, drain time.Duration) *stoppable {
		args := []string{"run", env.path, "--redis", env.url}
		if drain > 0 {
			args = append(args, "--drain-timeout", drain.String())
		}
		p := startBinary(t, buildBinary(t, "./testdata/flowrun-shutdown"), args...)
		return &stoppable{
			log: p.log,
			stop: func(t *testing.T) {
				t.Helper()
				if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the process to begin stopping", func() bool {
					return strings.Contains(p.log.String(), "stopping: reading nothing new")
				})
			},
			wait: func(t *testing.T) error { return waitProcess(t, p) },
		}
	},
	job: func(t *testing.T, env *shutdownEnv) {
		t.Helper()
		p := startBinary(t, buildBinary(t, "./testdata/flowrun-shutdown"), "run", env.path, "--redis", env.url, "--until-drained")
		if err := waitProcess(t, p); err != nil {
			t.Fatalf("the job after the stop: %v\n%s", err, p.log.String())
		}
	},
}

// canceled runs pipelines with runtime.Run, and stops them by canceling its context.
var canceled = stopKind{
	name: "canceled",
	start: func(t *testing.T, env *shutdownEnv, drain time.Duration) *stoppable {
		log := &syncBuffer{}
		opts := env.opts
		opts.Redis, opts.Logger, opts.DrainTimeout = openURLs(t, env.url), newLogger(log), drain
		rt, err := runtime.New(env.plan, opts)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		var runErr error
		go func() {
			defer close(ended)
			_, runErr = rt.Run(ctx)
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-ended:
			case <-time.After(time.Minute):
				t.Error("the run did not end a minute after the test")
			}
		})
		return &stoppable{
			log:  log,
			stop: func(*testing.T) { cancel() }, // the run's workers see it at once
			wait: func(t *testing.T) error {
				t.Helper()
				select {
				case <-ended:
					return runErr
				case <-time.After(2 * time.Minute):
					t.Fatalf("the run did not end two minutes after the stop:\n%s", log.String())
					return nil
				}
			},
		}
	},
	job: func(t *testing.T, env *shutdownEnv) {
		t.Helper()
		runJob(t, openURLs(t, env.url), env.plan, env.opts)
	},
}

var stopKinds = []stopKind{sigterm, canceled}

// groupState is what a group did with the entries of a topic, by message number: acknowledged,
// pending (delivered to a consumer and not acknowledged), or unread (not yet delivered).
type groupState struct {
	acked, pending, unread map[int]bool
	deliveries             map[int]int64 // of each pending message
}

func readGroupState(t *testing.T, env *shutdownEnv, topic string, partitions int, group string) groupState {
	t.Helper()
	ctx := context.Background()
	rdb := env.c.Universal()
	g := groupState{acked: map[int]bool{}, pending: map[int]bool{}, unread: map[int]bool{}, deliveries: map[int]int64{}}
	for p := range partitions {
		stream := env.keys.Stream(topic, p)
		entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		st, err := env.c.StreamStats(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		last := ""
		for _, gr := range st.Groups {
			if gr.Name == group {
				last = gr.LastDeliveredID
			}
		}
		pending := map[string]int64{}
		if last != "" {
			ps, err := rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: stream, Group: group, Start: "-", End: "+", Count: 1 << 20}).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ps {
				pending[e.ID] = e.RetryCount
			}
		}
		for _, e := range entries {
			i := int(jsonObject(t, e.Values["payload"].(string))["i"].(float64))
			after := 1
			if last != "" {
				if after, err = redis.CompareIDs(e.ID, last); err != nil {
					t.Fatal(err)
				}
			}
			n, isPending := pending[e.ID]
			switch {
			case after > 0:
				g.unread[i] = true
			case isPending:
				g.pending[i], g.deliveries[i] = true, n
			default:
				g.acked[i] = true
			}
		}
	}
	return g
}

// deadLettersOf returns the length of a node's dead-letter stream.
func deadLettersOf(t *testing.T, env *shutdownEnv, node string) int64 {
	t.Helper()
	n, err := env.c.StreamLen(context.Background(), env.keys.DeadLetter(node))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// retriesOf returns how many messages wait in a node's retry sets.
func retriesOf(t *testing.T, env *shutdownEnv, topic string, partitions int, node string) (n int64) {
	t.Helper()
	for p := range partitions {
		k, err := env.c.ScheduledRetries(context.Background(), env.keys.Retry(topic, p, node))
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	return n
}

// sameNumbers reports the differences between two sets of message numbers.
func sameNumbers(t *testing.T, what string, got map[int]bool, want map[int]int) {
	t.Helper()
	var missing, extra []int
	for i := range want {
		if !got[i] {
			missing = append(missing, i)
		}
	}
	for i := range got {
		if want[i] == 0 {
			extra = append(extra, i)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing)+len(extra) > 0 {
		t.Errorf("%s: %d missing %v, %d not expected %v", what, len(missing), missing, len(extra), extra)
	}
}

// keysInOrder checks that the messages of each key came in the order of their numbers.
func keysInOrder(t *testing.T, order map[string][]int) {
	t.Helper()
	for k, seq := range order {
		if !slices.IsSorted(seq) {
			t.Errorf("the messages of key %s came out of order: %v", k, seq)
		}
	}
}

// stoppedCleanly checks a run's end after a stop.
func stoppedCleanly(t *testing.T, svc *stoppable) {
	t.Helper()
	if err := svc.wait(t); err != nil {
		t.Fatalf("the run did not stop cleanly: %v\n%s", err, svc.log.String())
	}
}

// TestStopFinishesDeliveriesInFlight stops a pipeline while its http sink waits for a slow
// service: 40 messages were delivered, and the service holds every request after them. The stop
// comes, then the service answers: with the default drain time the held deliveries and the rest of
// their batches are finished and acknowledged, and nothing else is read. The job that runs next
// delivers the rest, and no message arrives twice.
func TestStopFinishesDeliveriesInFlight(t *testing.T) {
	t.Parallel()
	const n = 400
	for _, via := range stopKinds {
		t.Run(via.name, func(t *testing.T) {
			ctl := newController(t, func(_, _, accepted int) answer {
				if accepted < 40 {
					return answerAccept
				}
				return answerHold
			})
			env := newShutdownEnv(t, httpSinkPipeline(ctl.url))
			publishCalls(t, env, 0, n/2, ctl.url)
			svc := via.start(t, env, 0)
			waitFor(t, "40 deliveries, and then deliveries held by the service", func() bool {
				s := ctl.state()
				return len(s.accepted) == 40 && len(s.held) > 0
			})
			publishCalls(t, env, n/2, n, ctl.url) // while the sink's partitions are busy
			inFlight := ctl.state().held
			svc.stop(t)
			ctl.releaseHeld()
			stoppedCleanly(t, svc)

			got := ctl.state().accepted
			st := readGroupState(t, env, "in", 4, "hook")
			for i := range inFlight {
				if got[i] != 1 || !st.acked[i] {
					t.Errorf("message %d, in flight at the stop: delivered %d times, acknowledged %v; want once, and acknowledged",
						i, got[i], st.acked[i])
				}
			}
			sameNumbers(t, "acknowledged after the stop, compared with delivered", st.acked, got)
			if len(st.pending) > 0 {
				t.Errorf("%d messages left pending by a stop with the default drain time: %v", len(st.pending), st.pending)
			}
			if len(st.unread) == 0 {
				t.Fatal("every message was read before the stop: the stop did not come mid-stream")
			}
			if d := deadLettersOf(t, env, "hook"); d > 0 {
				t.Errorf("%d dead letters", d)
			}
			t.Logf("%s: %d in flight at the stop; %d delivered and acknowledged, %d unread",
				via.name, len(inFlight), len(st.acked), len(st.unread))

			via.job(t, env)
			s := ctl.state()
			if dups := tally(t, s.accepted, n); dups > 0 {
				t.Errorf("%d messages delivered twice", dups)
			}
			keysInOrder(t, s.order)
		})
	}
}

// TestStopLeavesWaitingRetriesPending stops a pipeline while messages wait in the process for their
// retry (an hour away): with retry_in_place, and with a delay under Options.RetryInPlaceUpTo. The
// other messages of their partitions go on meanwhile. The stop abandons the waiting messages
// and the messages behind them in their lanes: they are left pending, neither acknowledged nor
// dead-lettered nor moved to the retry set, while everything that succeeded is acknowledged. The
// job that runs next delivers each of them once, and keeps each key's order.
func TestStopLeavesWaitingRetriesPending(t *testing.T) {
	t.Parallel()
	const n = 400
	failing := func(i int) bool { return i < 4 } // the first message of each partition
	type variant struct {
		name       string
		attributes string // of the stage
		opts       runtime.Options
		via        stopKind
	}
	var variants []variant
	for _, via := range stopKinds {
		variants = append(variants, variant{"retry_in_place/" + via.name, "retry = retry.later\n  retry_in_place = true", runtime.Options{}, via})
	}
	// Options.RetryInPlaceUpTo has no flag: in process only.
	variants = append(variants, variant{"RetryInPlaceUpTo/canceled", "retry = retry.later", runtime.Options{RetryInPlaceUpTo: 2 * time.Hour}, canceled})
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctl := newController(t, func(i, request, _ int) answer {
				if failing(i) && request == 1 {
					return answerFail
				}
				return answerAccept
			})
			env := newShutdownEnv(t, callStagePipeline(v.attributes))
			env.opts = v.opts
			publishCalls(t, env, 0, n/2, ctl.url)
			svc := v.via.start(t, env, 0)
			waitFor(t, "every failing message to fail once, and 100 others to pass", func() bool {
				s := ctl.state()
				for i := range n / 2 {
					if failing(i) && s.requests[i] == 0 {
						return false
					}
				}
				return len(s.accepted) >= 100
			})
			publishCalls(t, env, n/2, n, ctl.url)
			svc.stop(t)
			stoppedCleanly(t, svc)

			s := ctl.state()
			st := readGroupState(t, env, "in", 4, "work")
			for i := range n / 2 {
				if failing(i) && (!st.pending[i] || st.deliveries[i] != 1 || s.requests[i] != 1) {
					t.Errorf("message %d, waiting for its retry at the stop: pending %v, delivered %d times, attempted %d times; want pending, delivered and attempted once",
						i, st.pending[i], st.deliveries[i], s.requests[i])
				}
			}
			sameNumbers(t, "acknowledged after the stop, compared with passed", st.acked, s.accepted)
			if d := deadLettersOf(t, env, "work"); d > 0 {
				t.Errorf("%d dead letters", d)
			}
			if r := retriesOf(t, env, "in", 4, "work"); r > 0 {
				t.Errorf("%d messages moved to the retry set: they were to wait in the process", r)
			}
			t.Logf("%s: %d passed and acknowledged before the stop, %d left pending, %d unread",
				v.name, len(st.acked), len(st.pending), len(st.unread))

			v.via.job(t, env)
			s = ctl.state()
			if dups := tally(t, s.accepted, n); dups > 0 {
				t.Errorf("%d messages passed the stage twice", dups)
			}
			for i := range n / 2 {
				if failing(i) && s.requests[i] != 2 {
					t.Errorf("message %d was attempted %d times, want twice: once before the stop, once after", i, s.requests[i])
				}
			}
			keysInOrder(t, s.order)
			if dups := tally(t, arrivals(t, env.c, env.keys.Prefix+":out"), n); dups > 0 {
				t.Errorf("%d messages arrived twice", dups)
			}
		})
	}
}

// TestStopLeavesMessagesPausedAtTheBreaker stops a pipeline whose http sink, or Go stage, is
// paused: after 40 messages its service answers 503 (which the stage returns as stages.Transient),
// and the node's messages wait at its circuit breaker. The stop abandons them: they are left
// pending, neither acknowledged nor dead-lettered, while the 40 are acknowledged. Once the service
// is back, the job that runs next delivers every message once.
func TestStopLeavesMessagesPausedAtTheBreaker(t *testing.T) {
	t.Parallel()
	const n = 400
	for _, node := range []struct {
		name     string
		pipeline func(url string) func(prefix string) string
	}{
		{"hook", httpSinkPipeline},
		{"work", func(string) func(string) string { return callStagePipeline("") }},
	} {
		for _, via := range stopKinds {
			t.Run(node.name+"/"+via.name, func(t *testing.T) {
				ctl := newController(t, func(_, _, accepted int) answer {
					if accepted < 40 {
						return answerAccept
					}
					return answerAway
				})
				env := newShutdownEnv(t, node.pipeline(ctl.url))
				publishCalls(t, env, 0, n/2, ctl.url)
				svc := via.start(t, env, 0)
				waitFor(t, "40 messages, and then the node paused", func() bool {
					s := ctl.state()
					return len(s.accepted) == 40 && s.unavailable > 0 && strings.Contains(svc.log.String(), "attempts fail transiently")
				})
				publishCalls(t, env, n/2, n, ctl.url)
				svc.stop(t)
				stoppedCleanly(t, svc)

				s := ctl.state()
				st := readGroupState(t, env, "in", 4, node.name)
				sameNumbers(t, "acknowledged after the stop, compared with accepted by the service", st.acked, s.accepted)
				if len(st.pending) == 0 {
					t.Error("no message pending after the stop: none was paused at the breaker")
				}
				if d := deadLettersOf(t, env, node.name); d > 0 {
					t.Errorf("%d dead letters", d)
				}
				if r := retriesOf(t, env, "in", 4, node.name); r > 0 {
					t.Errorf("%d messages in the retry set", r)
				}
				t.Logf("%s/%s: %d accepted and acknowledged, %d paused and left pending, %d unread, %d answers 503",
					node.name, via.name, len(st.acked), len(st.pending), len(st.unread), s.unavailable)

				ctl.setRule(acceptAll)
				via.job(t, env)
				s = ctl.state()
				if dups := tally(t, s.accepted, n); dups > 0 {
					t.Errorf("%d messages accepted twice", dups)
				}
				keysInOrder(t, s.order)
				if node.name == "work" {
					if dups := tally(t, arrivals(t, env.c, env.keys.Prefix+":out"), n); dups > 0 {
						t.Errorf("%d messages arrived twice", dups)
					}
				}
			})
		}
	}
}

// TestStopPastTheDrainTimeoutAbandonsDeliveries stops a pipeline whose http sink waits for a
// service that never answers, with a drain timeout of 100ms: the stop gives the deliveries up
// and ends; the held messages are left pending, not acknowledged, not dead-lettered. The job that
// runs next delivers every message; a message arrives twice only if the stop had delivered it
// and left it unacknowledged with its batch.
func TestStopPastTheDrainTimeoutAbandonsDeliveries(t *testing.T) {
	t.Parallel()
	const n = 400
	for _, via := range stopKinds {
		t.Run(via.name, func(t *testing.T) {
			ctl := newController(t, func(_, _, accepted int) answer {
				if accepted < 40 {
					return answerAccept
				}
				return answerHold // until the client gives up
			})
			env := newShutdownEnv(t, httpSinkPipeline(ctl.url))
			publishCalls(t, env, 0, n/2, ctl.url)
			svc := via.start(t, env, 100*time.Millisecond)
			waitFor(t, "40 deliveries, and then deliveries held by the service", func() bool {
				s := ctl.state()
				return len(s.accepted) == 40 && len(s.held) > 0
			})
			publishCalls(t, env, n/2, n, ctl.url)
			inFlight := ctl.state().held
			svc.stop(t)
			stoppedCleanly(t, svc)
			if !strings.Contains(svc.log.String(), "drain timeout: abandoning work in flight") {
				t.Errorf("the stop did not reach its drain timeout:\n%s", svc.log.String())
			}

			before := ctl.state().accepted
			st := readGroupState(t, env, "in", 4, "hook")
			for i := range inFlight {
				if !st.pending[i] || before[i] != 0 {
					t.Errorf("message %d, held when the drain timed out: pending %v, delivered %d times; want pending and not delivered",
						i, st.pending[i], before[i])
				}
			}
			for i := range st.acked {
				if before[i] == 0 {
					t.Errorf("message %d was acknowledged without being delivered", i)
				}
			}
			if d := deadLettersOf(t, env, "hook"); d > 0 {
				t.Errorf("%d dead letters", d)
			}
			t.Logf("%s: %d held at the stop; %d delivered, %d acknowledged, %d left pending, %d unread",
				via.name, len(inFlight), len(before), len(st.acked), len(st.pending), len(st.unread))

			ctl.setRule(acceptAll)
			via.job(t, env)
			after := ctl.state().accepted
			dups := tally(t, after, n)
			for i, k := range after {
				if k > 1 && (k > 2 || before[i] != 1 || !st.pending[i]) {
					t.Errorf("message %d delivered %d times: only a message delivered before the stop and left pending may come twice", i, k)
				}
			}
			t.Logf("%s: %d delivered twice, each delivered before the stop and not acknowledged", via.name, dups)
		})
	}
}

// A job ends once its sources are done and no stage or sink has anything left to do: nothing
// unread (lag), nothing pending, nothing waiting in a retry set. Each test below leaves exactly one
// of these at the end: the job must outlast several checks for the end of its work, and deliver
// every message before Run returns.

// drainChecks counts a job's checks for the end of its work. Each check, once the sources are done,
// reads the state of every stream the job consumes, starting with the first stage's partition 0
// (XINFO GROUPS, in a pipeline). The poll of the streams for Snapshot reads it too: once at the
// start, as the jobs below poll every hour.
type drainChecks struct {
	stream string
	n      atomic.Int64
}

func (d *drainChecks) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (d *drainChecks) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (d *drainChecks) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			if a := cmd.Args(); len(a) == 3 && a[0] == "xinfo" && a[1] == "groups" && a[2] == d.stream {
				d.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// drainingJob is a job run by a test.
type drainingJob struct {
	rt     *runtime.Runtime
	log    syncBuffer
	checks *drainChecks
	ended  chan struct{}
	err    error
}

// startDrainingJob runs plan as a job, with opts (Redis, Logger and the intervals set here).
func startDrainingJob(t *testing.T, plan *flow.Plan, opts runtime.Options) *drainingJob {
	t.Helper()
	c := openURLs(t, redistest.Shared(t).URL())
	j := &drainingJob{checks: &drainChecks{stream: redis.Keys{Prefix: plan.KeyPrefix}.Stream("in", 0)}, ended: make(chan struct{})}
	c.Universal().AddHook(j.checks)
	opts.Redis, opts.UntilDrained, opts.Logger = c, true, newLogger(&j.log)
	opts.PollInterval, opts.DrainTimeout, opts.LeaseTTL = time.Hour, 2*time.Second, 10*time.Second
	rt, err := runtime.New(plan, opts)
	if err != nil {
		t.Fatal(err)
	}
	j.rt = rt
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(j.ended)
		_, j.err = rt.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-j.ended:
		case <-time.After(time.Minute):
			t.Error("the job did not end a minute after the test")
		}
	})
	return j
}

func (j *drainingJob) done() bool {
	select {
	case <-j.ended:
		return true
	default:
		return false
	}
}

// source returns the progress of the job's source.
func (j *drainingJob) source() runtime.SourceProgress {
	if s := j.rt.Snapshot().Sources; len(s) > 0 {
		return s[0]
	}
	return runtime.SourceProgress{}
}

// outlasts waits for four more checks for the end of the job (two in a row that find nothing to do
// end it), and fails the test if the job ends first.
func (j *drainingJob) outlasts(t *testing.T, left string) {
	t.Helper()
	base := j.checks.n.Load()
	waitFor(t, "four more checks for the end of the job", func() bool { return j.checks.n.Load() >= base+4 || j.done() })
	if j.done() {
		t.Fatalf("the job ended with %s (err %v):\n%s", left, j.err, j.log.String())
	}
}

// wait waits for the end of the job.
func (j *drainingJob) wait(t *testing.T) {
	t.Helper()
	select {
	case <-j.ended:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the job did not end:\n%s", j.log.String())
	}
	if j.err != nil {
		t.Fatalf("the job: %v\n%s", j.err, j.log.String())
	}
}

// drainPipeline generates n numbered messages, keyed over 40 keys, into topic in (2 partitions), and
// runs them through stage into a stream. With reversed, message 0 is the last one generated.
func drainPipeline(out string, n int, reversed bool, extra, stage string) string {
	i := "index"
	if reversed {
		i = fmt.Sprintf("(%d - index)", n-1)
	}
	return fmt.Sprintf(`
pipeline "drain" {}
%s
topic "in" {
  partitions = 2
  key        = msg.k
}
topic "done" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = %d
  output   = topic.in
  template = {
    i   = %s
    k   = "k${%s %% 40}"
    url = var.url
    run = var.run
  }
}
variable "url" {
  default = ""
}
variable "run" {
  default = ""
}
stage "work" {
  input  = topic.in
  output = topic.done
  %s
}
sink "out" {
  kind   = "redis_stream"
  input  = topic.done
  stream = %q
}
`, extra, n, i, i, stage, out)
}

// partitionOf returns the partition of topic in (2 partitions) that message i goes to.
func partitionOf(i int) int { return redis.Partition(fmt.Sprintf("k%d", i%40), 2) }

// TestJobWaitsForAStageBehind: when the source is done, one partition of a stage has not been
// read at all, as another process still holds its lease. Nothing is pending and nothing waits for
// a retry: only the lag says that work is left. The job waits until the lease is free and the
// partition processed.
func TestJobWaitsForAStageBehind(t *testing.T) {
	const n = 200
	ctx := context.Background()
	c := server.open(t)
	out := fmt.Sprintf("drain-lag-%d:out", prefixes.Add(1))
	plan := buildSource(t, drainPipeline(out, n, false, "", `kind = "map"
  set    = { worked = true }`))
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	// Another process holds the stage's partition 1, on which a group exists from an earlier run.
	if err := c.EnsureGroup(ctx, keys.Stream("in", 1), redis.Group("work")); err != nil {
		t.Fatal(err)
	}
	other, ok, err := c.AcquireLease(ctx, keys.Lease("in", 1, "work"), "another-process", time.Hour)
	if err != nil || !ok {
		t.Fatalf("taking the lease: %v, %v", ok, err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			if err := c.ReleaseLease(ctx, other); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(release)
	behind := 0
	for i := range n {
		if partitionOf(i) == 1 {
			behind++
		}
	}

	j := startDrainingJob(t, plan, runtime.Options{})
	waitFor(t, "the source to finish and partition 0 to be processed", func() bool {
		return j.source().Done && len(arrivals(t, c, out)) == n-behind &&
			backlogOf(t, c, keys.Stream("in", 1), "work") == int64(behind)
	})
	j.outlasts(t, fmt.Sprintf("%d messages unread by stage work", behind))
	if lag := backlogOf(t, c, keys.Stream("in", 1), "work"); lag != int64(behind) {
		t.Fatalf("partition 1 has a backlog of %d, want %d unread", lag, behind)
	}
	release()
	j.wait(t)
	if dups := tally(t, arrivals(t, c, out), n); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}
}

// TestJobWaitsForAPendingMessage: when the source is done and every other message has arrived,
// the stage still works on message 0, the last one generated (test.gate holds it): nothing is
// unread, nothing waits for a retry, only the pending entry says that work is left. The job waits
// until the stage lets it go.
func TestJobWaitsForAPendingMessage(t *testing.T) {
	const n = 200
	c := server.open(t)
	run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
	g := &gate{entered: make(chan struct{}), open: make(chan struct{})}
	gates.Store(run, g)
	var opened sync.Once
	open := func() { opened.Do(func() { close(g.open) }) }
	t.Cleanup(func() {
		open()
		gates.Delete(run)
	})
	out := run + ":out"
	plan := buildSource(t, drainPipeline(out, n, true, "", `kind = "go"
  func   = "test.gate"`), "run="+run)
	keys := redis.Keys{Prefix: plan.KeyPrefix}

	// One entry a read, so that message 0 is alone in its batch: the others arrive meanwhile.
	j := startDrainingJob(t, plan, runtime.Options{BatchSize: 1})
	waitFor(t, "the source to finish and every message but 0 to arrive, 0 held by the stage", func() bool {
		select {
		case <-g.entered:
		default:
			return false
		}
		return j.source().Done && len(arrivals(t, c, out)) == n-1
	})
	j.outlasts(t, "message 0 pending in stage work")
	st, err := c.StreamStats(context.Background(), keys.Stream("in", partitionOf(0)))
	if err != nil {
		t.Fatal(err)
	}
	for _, gr := range st.Groups {
		if gr.Name == "work" && (gr.Pending != 1 || gr.Lag != 0) {
			t.Fatalf("stage work on message 0's partition: %d pending, lag %d; want 1 and 0", gr.Pending, gr.Lag)
		}
	}
	open()
	j.wait(t)
	if dups := tally(t, arrivals(t, c, out), n); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}
}

// TestJobWaitsForAScheduledRetry: message 0, the last one generated, fails once, and waits in the
// stage's retry set in Redis (its delay, an hour, is above RetryInPlaceUpTo): its entry is
// acknowledged, nothing is unread or pending, every other message has arrived; only the retry set
// says that work is left. The job waits until the retry is due (the test makes it due now) and
// processed.
func TestJobWaitsForAScheduledRetry(t *testing.T) {
	const n = 200
	ctx := context.Background()
	c := server.open(t)
	ctl := newController(t, func(i, request, _ int) answer {
		if i == 0 && request == 1 {
			return answerFail
		}
		return answerAccept
	})
	out := fmt.Sprintf("drain-retry-%d:out", prefixes.Add(1))
	plan := buildSource(t, drainPipeline(out, n, true, `retry "later" {
  max_attempts = 3
  backoff      = "constant"
  initial      = "1h"
  max          = "1h"
}`, `kind  = "go"
  func   = "test.call"
  retry  = retry.later`), "url="+ctl.url)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	retryKey := keys.Retry("in", partitionOf(0), "work")
	scheduled := func() int64 {
		k, err := c.ScheduledRetries(ctx, retryKey)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}

	j := startDrainingJob(t, plan, runtime.Options{})
	waitFor(t, "the source to finish, every message but 0 to arrive, and 0 to wait in the retry set", func() bool {
		return j.source().Done && len(arrivals(t, c, out)) == n-1 && scheduled() == 1
	})
	j.outlasts(t, "message 0 waiting in the retry set")
	if backlog := backlogOf(t, c, keys.Stream("in", partitionOf(0)), "work"); backlog != 0 {
		t.Fatalf("stage work has %d entries unread or pending, want none: message 0 waits in the retry set", backlog)
	}
	// Due now.
	rdb := c.Universal()
	members, err := rdb.ZRange(ctx, retryKey, 0, -1).Result()
	if err != nil || len(members) != 1 {
		t.Fatalf("the retry set holds %v (%v), want one retry", members, err)
	}
	if err := rdb.ZAddXX(ctx, retryKey, goredis.Z{Score: 0, Member: members[0]}).Err(); err != nil {
		t.Fatal(err)
	}
	j.wait(t)
	if dups := tally(t, arrivals(t, c, out), n); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}
	if r := ctl.state().requests[0]; r != 2 {
		t.Errorf("message 0 was attempted %d times, want twice", r)
	}
}
