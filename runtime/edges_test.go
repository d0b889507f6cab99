package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The edges of a pipeline: sources that write into it while Redis goes away, sinks whose
// downstream goes away, and what the user sees meanwhile.

// sourcePipeline reads numbered messages from a source of the given kind ("generate" makes n of
// them) into a keyed topic, and copies them to the stream out.
func sourcePipeline(prefix, kind, delivery, out string, n int) string {
	var src string
	switch kind {
	case "generate":
		// Paced so that the outage begins mid-stream even on a loaded machine, where the sink's
		// first arrivals (which the test waits for) lag far behind the source.
		src = fmt.Sprintf(`kind  = "generate"
  count = %d
  rate  = 1000
  template = {
    i = index
    k = "k${index %% 40}"
  }`, n)
	case "file":
		src = `kind = "file"
  path = var.path`
	case "stdin":
		src = `kind = "stdin"`
	}
	return fmt.Sprintf(`
pipeline "edges" {
  key_prefix = %q
  delivery   = %q
}
variable "path" {
  type    = string
  default = ""
}
topic "in" {
  partitions = 4
  key        = msg.k
}
source "src" {
  %s
  output = topic.in
}
sink "out" {
  kind   = "redis_stream"
  input  = topic.in
  stream = %q
}
`, prefix, delivery, src, out)
}

// numberedLines writes the JSON lines of messages from..to-1 to w.
func numberedLines(w io.Writer, from, to int) error {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "{\"i\":%d,\"k\":\"k%d\"}\n", i, i%40)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// TestSourcesWaitThroughARedisOutage shuts Redis down for 2s while each kind of producing source is
// in the middle of its input, and starts it again (with its AOF): the source waits, logs the
// outage once, loses nothing, and the job ends by itself. With effectively_once nothing arrives
// twice; with at_least_once a batch whose reply was lost may.
func TestSourcesWaitThroughARedisOutage(t *testing.T) {
	const n, firstPart = 8000, 2000
	for _, kind := range []string{"generate", "file", "stdin"} {
		for _, delivery := range []string{"at_least_once", "effectively_once"} {
			t.Run(kind+"/"+delivery, func(t *testing.T) {
				t.Parallel()
				srv := redistest.Start(t, redistest.WithAOF())
				c := openURLs(t, srv.URL())
				prefix := fmt.Sprintf("outage-%d", prefixes.Add(1))
				out := prefix + ":out"
				// The input of file and stdin sources is fed by the test: a first part, then the
				// rest once Redis is down, so that the source has to wait mid-stream.
				var input io.WriteCloser
				var stdin io.Reader
				var vars []string
				switch kind {
				case "file":
					path := filepath.Join(t.TempDir(), "in.jsonl")
					if err := syscall.Mkfifo(path, 0o600); err != nil {
						t.Fatal(err)
					}
					vars = append(vars, "path="+path)
					opened := make(chan *os.File, 1)
					go func() {
						f, err := os.OpenFile(path, os.O_WRONLY, 0)
						if err != nil {
							t.Error(err)
						}
						opened <- f
					}()
					defer func() {
						if f := <-opened; f != nil {
							f.Close()
						}
					}()
					input = fifoWriter{opened: opened}
				case "stdin":
					pr, pw := io.Pipe()
					stdin, input = pr, pw
				}
				plan := buildSource(t, sourcePipeline(prefix, kind, delivery, out, n), vars...)
				var log syncBuffer
				rt, err := runtime.New(plan, runtime.Options{
					Redis: openURLs(t, srv.URL()), UntilDrained: true, Stdin: stdin, Logger: newLogger(&log),
				})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				done := make(chan error, 1)
				var summary *runtime.Summary
				go func() {
					var err error
					summary, err = rt.Run(ctx)
					done <- err
				}()
				rest := make(chan struct{})
				fed := make(chan error, 1)
				if input != nil {
					go func() {
						err := numberedLines(input, 0, firstPart)
						<-rest
						if err == nil {
							err = numberedLines(input, firstPart, n)
						}
						fed <- err
						input.Close()
					}()
				}

				waitFor(t, "the first messages to arrive", func() bool { return len(arrivals(t, c, out)) >= firstPart/2 })
				srv.Stop()
				close(rest)
				waitFor(t, "Redis to have been down for 2s, as the runtime sees it", func() bool {
					since := rt.Snapshot().RedisFailingSince
					return !since.IsZero() && time.Since(since) >= 2*time.Second
				})
				producedWhileDown := rt.Snapshot().Sources[0].Produced
				if producedWhileDown >= n {
					t.Fatalf("the source had written all %d messages before Redis went down: nothing was tested", producedWhileDown)
				}
				restarted := time.Now()
				srv.Start(t)
				if err := <-done; err != nil {
					t.Fatalf("the job: %v\n%s", err, log.String())
				}
				if input != nil {
					if err := <-fed; err != nil {
						t.Fatal(err)
					}
				}
				dups := tally(t, arrivals(t, c, out), n)
				// A message counts as produced only once Redis has it: what the source had counted
				// while Redis was down had all been written before it went down.
				if before := entriesBefore(t, c, redis.Keys{Prefix: plan.KeyPrefix}.Streams("in", 4), restarted); producedWhileDown > before {
					t.Errorf("while Redis was down the source counted %d messages produced, but Redis had %d of them", producedWhileDown, before)
				}
				src := summaryNode(summary, "src")
				t.Logf("%s, %s: %d messages, %d duplicated; the source counted %d written", kind, delivery, n, dups, src.Out)
				if src.Out != n || src.DeadLettered != 0 {
					t.Errorf("the source counted %d written and %d dead-lettered, want %d and 0", src.Out, src.DeadLettered, n)
				}
				// The duplicates allowed: none with effectively_once (markers). With at_least_once,
				// the source's batch whose reply the outage cut off may be written again: one
				// batch (the source writes one at a time, up to 1000 entries); the sink's commits
				// are transactions that are never done twice. A lease lost (none is expected:
				// the outage is shorter than the TTL) would allow a batch of the sink's.
				losses := leaseLosses(log.String())
				allowed := redis.DefaultBatchSize + losses*redis.DefaultReadCount
				if delivery == "effectively_once" {
					allowed = 0
				}
				if dups > allowed {
					t.Errorf("%d duplicates with %s, want at most %d (%d leases lost)", dups, delivery, allowed, losses)
				}
				if os.Getenv("SHOW_LOG") != "" {
					t.Log(log.String())
				}
				if warned := strings.Count(log.String(), "Redis is failing"); warned != 1 {
					t.Errorf("the outage was reported %d times, want once:\n%s", warned, log.String())
				}
			})
		}
	}
}

// entriesBefore counts the entries of the streams whose IDs were given before t (by Redis's clock,
// which is this machine's).
func entriesBefore(t *testing.T, c *redis.Client, streams []string, before time.Time) int64 {
	t.Helper()
	var n int64
	end := strconv.FormatInt(before.UnixMilli(), 10)
	for _, s := range streams {
		entries, err := c.Universal().XRange(context.Background(), s, "-", end).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += int64(len(entries))
	}
	return n
}

// deadline is a context that ends when the test does or two minutes from now, whichever comes
// first: a broken runtime fails the test instead of hanging it.
func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// summaryNode returns a node's counts from a summary.
func summaryNode(s *runtime.Summary, name string) runtime.NodeSummary {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n
		}
	}
	return runtime.NodeSummary{}
}

// fifoWriter writes to a named pipe once its other end is open.
type fifoWriter struct{ opened chan *os.File }

func (w fifoWriter) Write(p []byte) (int, error) {
	f := <-w.opened
	defer func() { w.opened <- f }()
	return f.Write(p)
}

func (w fifoWriter) Close() error {
	f := <-w.opened
	defer func() { w.opened <- nil }()
	return f.Close()
}

// receiver is an HTTP service that counts the messages it receives by their number, field i. A
// held receiver answers nothing until it is released.
type receiver struct {
	hold     chan struct{}
	released sync.Once
	mu       sync.Mutex
	got      map[int]int
}

func newReceiver(held bool) *receiver {
	rc := &receiver{hold: make(chan struct{}), got: map[int]int{}}
	if !held {
		rc.release()
	}
	return rc
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	<-rc.hold
	var m struct{ I int }
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.got[m.I]++
	rc.mu.Unlock()
}

// release lets the held requests through; it may be called more than once.
func (rc *receiver) release() { rc.released.Do(func() { close(rc.hold) }) }

// received returns how often each message number arrived.
func (rc *receiver) received() map[int]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return maps.Clone(rc.got)
}

// backlogOf measures, independently of the runtime, the entries of a stream that a group has not
// processed: not delivered to it, or delivered and not acknowledged (all of them before the group
// exists).
func backlogOf(t *testing.T, c *redis.Client, stream, group string) int64 {
	t.Helper()
	st, err := c.StreamStats(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.Groups {
		if g.Name == group {
			return g.Lag + g.Pending
		}
	}
	return st.Length
}

// TestBackpressureHoldsASourceBack runs a fast generate source into a topic with max_lag = 100
// whose only reader, an http sink, is stalled: the source waits at the cap (and says so), the
// backlog of each partition never passes it, and once the sink goes on everything arrives.
func TestBackpressureHoldsASourceBack(t *testing.T) {
	const n, maxLag, partitions = 2000, 100, 2
	rc := newReceiver(true)
	svc := httptest.NewServer(rc)
	defer svc.Close()
	defer rc.release() // before Close, which waits for the held requests: a failing test must not hang
	c := server.open(t)
	plan := buildSource(t, fmt.Sprintf(`
pipeline "backpressure" {}
variable "url" {}
topic "in" {
  partitions = %d
  key        = msg.k
  max_lag    = %d
}
source "gen" {
  kind     = "generate"
  count    = %d
  output   = topic.in
  template = {
    i = index
    k = "k${index %% 10}"
  }
}
sink "slow" {
  kind  = "http"
  input = topic.in
  url   = var.url
}
`, partitions, maxLag, n), "url="+svc.URL)
	var log syncBuffer
	rt, err := runtime.New(plan, runtime.Options{Redis: c, UntilDrained: true, Logger: newLogger(&log)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var summary *runtime.Summary
	go func() {
		var err error
		summary, err = rt.Run(deadline(t))
		done <- err
	}()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	worst := int64(0)
	backlogs := func() (total int64) {
		for p := range partitions {
			backlog := backlogOf(t, c, keys.Stream("in", p), "slow")
			worst = max(worst, backlog)
			total += backlog
		}
		return total
	}
	waitFor(t, "the source to be held back", func() bool {
		backlogs()
		return summaryNode(&runtime.Summary{Nodes: rt.Snapshot().Nodes}, "gen").HeldBackBy == "in"
	})
	if g, _ := getGraph(t, web.NewHandler(rt, nil)); g.node(t, "source.gen").HeldBackBy != "in" {
		t.Errorf("/api/graph does not show the source held back: %+v", g.node(t, "source.gen"))
	}
	if total := backlogs(); total != partitions*maxLag {
		t.Errorf("the source is held back with %d messages waiting in the topic, want %d (max_lag in each partition)", total, partitions*maxLag)
	}
	if p := rt.Snapshot().Sources[0].Produced; p >= n {
		t.Fatalf("the source wrote all %d messages: nothing held it back", p)
	}
	rc.release()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%v\n%s", err, log.String())
			}
			backlogs()
			if worst > maxLag {
				t.Errorf("a partition's backlog reached %d, past max_lag %d", worst, maxLag)
			}
			if dups := tally(t, rc.received(), n); dups > 0 {
				t.Errorf("%d messages delivered twice", dups)
			}
			gen := summaryNode(summary, "gen")
			if gen.HeldBack <= 0 || !strings.Contains(log.String(), "held back") {
				t.Errorf("the wait is not visible: held back %s in the summary, log:\n%s", gen.HeldBack, log.String())
			}
			t.Logf("the source was held back for %s; the worst backlog seen was %d (max_lag %d)", gen.HeldBack, worst, maxLag)
			return
		default:
			backlogs()
		}
	}
}

// TestBackpressureHoldsStagesAndPublishers chains two capped topics in front of a stalled sink: the
// stage between them waits at the second cap, the Publisher at the first, and neither topic's
// backlog passes its cap by more than one step of its writer (a batch of 10 published messages; a
// stage reads no more than the cap at a time).
func TestBackpressureHoldsStagesAndPublishers(t *testing.T) {
	const n, maxLag, step = 600, 50, 10
	rc := newReceiver(true)
	svc := httptest.NewServer(rc)
	defer svc.Close()
	defer rc.release() // before Close, which waits for the held requests: a failing test must not hang
	c := server.open(t)
	plan := buildSource(t, fmt.Sprintf(`
pipeline "backpressure" {}
variable "url" {}
topic "raw" {
  max_lag = %d
}
topic "cooked" {
  max_lag = %d
}
stage "copy" {
  kind   = "map"
  input  = topic.raw
  output = topic.cooked
  set    = { copied = true }
}
sink "slow" {
  kind  = "http"
  input = topic.cooked
  url   = var.url
}
`, maxLag, maxLag), "url="+svc.URL)
	var log syncBuffer
	ctx, stop := context.WithCancel(deadline(t))
	defer stop()
	rt, err := runtime.New(plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := rt.Run(ctx)
		done <- err
	}()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	var published atomic.Int64
	pubDone := make(chan error, 1)
	go func() {
		for i := 0; i < n; i += step {
			var batch []stages.Message
			for j := i; j < i+step; j++ {
				batch = append(batch, stages.NewMessage("", []byte(fmt.Sprintf(`{"i":%d}`, j)), nil))
			}
			if err := pub.PublishBatch(ctx, "raw", batch); err != nil {
				pubDone <- err
				return
			}
			published.Add(step)
		}
		pubDone <- pub.Close(ctx)
	}()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	worst := map[string]int64{}
	measure := func() {
		for topic, group := range map[string]string{"raw": "copy", "cooked": "slow"} {
			worst[topic] = max(worst[topic], backlogOf(t, c, keys.Stream(topic, 0), group))
		}
	}
	waitFor(t, "the stage and the publisher to be held back", func() bool {
		measure()
		return summaryNode(&runtime.Summary{Nodes: rt.Snapshot().Nodes}, "copy").HeldBackBy == "cooked" &&
			worst["raw"] >= maxLag
	})
	if p := published.Load(); p >= n {
		t.Fatalf("the publisher wrote all %d messages: nothing held it back", p)
	}
	rc.release()
	waitFor(t, "every message to arrive", func() bool {
		measure()
		return len(rc.received()) >= n
	})
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if dups := tally(t, rc.received(), n); dups > 0 {
		t.Errorf("%d messages delivered twice", dups)
	}
	if worst["raw"] > maxLag+step-1 || worst["cooked"] > 2*maxLag-1 {
		t.Errorf("backlogs reached %v: raw may pass max_lag %d by a published batch, cooked by a read", worst, maxLag)
	}
	t.Logf("worst backlogs %v with max_lag %d", worst, maxLag)
}

// TestFileSourceResumesAfterItsProcessDies kills a flowrun process with SIGKILL in the middle of a
// file (its topic's max_lag keeps the source from racing ahead of a slow stage) and runs the job
// again: the file source resumes at its checkpoint, so every line reaches the topic, and it does so
// once: on a single server the checkpoint and the lines it covers are written in one transaction,
// and with effectively_once the lines read again after the checkpoint leave no duplicate.
func TestFileSourceResumesAfterItsProcessDies(t *testing.T) {
	t.Parallel()
	const n = 5000
	bin := buildBinary(t, "./testdata/flowrun-faults")
	for _, b := range []struct {
		name string
		urls func(t *testing.T) []string
	}{
		{"server", func(t *testing.T) []string { return []string{redistest.Shared(t).URL()} }},
		{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t, 3).URLs() }},
	} {
		for _, delivery := range []string{"at_least_once", "effectively_once"} {
			t.Run(b.name+"/"+delivery, func(t *testing.T) {
				urls := b.urls(t)
				c := openURLs(t, urls...)
				prefix := fmt.Sprintf("resume-%d", prefixes.Add(1))
				dir := t.TempDir()
				input := filepath.Join(dir, "in.jsonl")
				f, err := os.Create(input)
				if err != nil {
					t.Fatal(err)
				}
				if err := numberedLines(f, 0, n); err != nil {
					t.Fatal(err)
				}
				f.Close()
				path := filepath.Join(dir, "resume.hcl")
				writeFile(t, path, fmt.Sprintf(`
pipeline "resume" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 2
  key        = msg.k
  max_lag    = 200
}
source "lines" {
  kind   = "file"
  path   = %q
  output = topic.in
}
stage "work" {
  kind  = "go"
  func  = "faults.slow"
  input = topic.in
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.work
  stream = "%s:out"
}
`, prefix, delivery, input, prefix))
				args := []string{"run", path, "--until-drained", "--lease-ttl", "1s"}
				for _, u := range urls {
					args = append(args, "--redis", u)
				}
				keys := redis.Keys{Prefix: prefix}
				position := func() int64 {
					raw, found, err := c.ReadCheckpoint(context.Background(), keys.SourcePosition("lines"))
					if err != nil {
						t.Fatal(err)
					}
					if !found {
						return 0
					}
					var p struct{ Line int64 }
					if err := json.Unmarshal([]byte(raw), &p); err != nil {
						t.Fatal(err)
					}
					return p.Line
				}
				first := startBinary(t, bin, args...)
				waitFor(t, "the source to be well into the file", func() bool { return position() >= 500 })
				first.kill(t)
				atKill := position()
				if atKill >= n {
					t.Fatal("the source had read the whole file before the kill: nothing was tested")
				}
				// What the killed process had read and not acknowledged: the only entries that the
				// next one can process a second time.
				inFlight := pendingFor(t, c, keys, "in", 2, "work", "") + pendingFor(t, c, keys, "work.out", 2, "out", "")
				second := startBinary(t, bin, args...)
				if err := waitProcess(t, second); err != nil {
					t.Fatalf("the restarted job: %v\n%s", err, second.log.String())
				}
				if !strings.Contains(second.log.String(), "resuming where the source stopped") {
					t.Errorf("the restarted source did not say it resumed:\n%s", second.log.String())
				}
				inTopic := map[int]int{}
				for p := range 2 {
					for i, k := range arrivals(t, c, keys.Stream("in", p)) {
						inTopic[i] += k
					}
				}
				reread := tally(t, inTopic, n)
				dups := tally(t, arrivals(t, c, prefix+":out"), n)
				losses := leaseLosses(first.log.String(), second.log.String())
				t.Logf("%s, %s: killed at line %d of %d with %d entries in flight; %d lines read twice into the topic, %d duplicated at the end, %d leases lost",
					b.name, delivery, atKill, n, inFlight, reread, dups, losses)
				// Lines read twice: none on a single server (the position is written with the
				// lines) or with effectively_once; on a cluster with at_least_once, the lines of
				// the source's last batch, whose position was not written: at most one batch.
				rereadAllowed := 0
				if b.name == "cluster" && delivery == "at_least_once" {
					rereadAllowed = redis.DefaultBatchSize
				}
				if reread > rereadAllowed {
					t.Errorf("%d lines reached the topic twice, want at most %d", reread, rereadAllowed)
				}
				// Duplicates at the end: none with effectively_once. With at_least_once, the lines
				// read twice, plus on a cluster (outputs before acks) one per entry in flight at the
				// kill, plus a batch per lost lease; on a single server nothing else.
				allowed := reread + losses*redis.DefaultReadCount
				switch {
				case delivery == "effectively_once":
					allowed = 0
				case b.name == "cluster":
					allowed += inFlight
				}
				if dups > allowed {
					t.Errorf("%d duplicates at the end, want at most %d", dups, allowed)
				}
			})
		}
	}
}

// TestSinkPausesThroughAnOutage points an http sink without a retry block at an address that
// refuses connections, and opens it once the sink has been paused for 6 seconds: nothing is
// dead-lettered, every message arrives once, and while the service was down the sink probed one
// message at a time instead of retrying every message.
func TestSinkPausesThroughAnOutage(t *testing.T) {
	t.Parallel()
	const n = 300
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // connections are refused until the service starts on the same port
	rc := newReceiver(false)
	svc := &http.Server{Handler: rc}
	defer svc.Close()
	plan := buildSource(t, fmt.Sprintf(`
pipeline "outage" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = %d
  output   = topic.in
  template = {
    i = index
    k = "k${index %% 7}"
  }
}
sink "hook" {
  kind  = "http"
  input = topic.in
  url   = "http://%s/orders"
}
`, n, addr))
	var log syncBuffer
	rt, err := runtime.New(plan, runtime.Options{Redis: server.open(t), UntilDrained: true, Logger: newLogger(&log)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var summary *runtime.Summary
	go func() {
		var err error
		summary, err = rt.Run(deadline(t))
		done <- err
	}()
	hook := func() runtime.NodeSummary { return summaryNode(&runtime.Summary{Nodes: rt.Snapshot().Nodes}, "hook") }
	waitFor(t, "the sink to be paused for 6s", func() bool {
		since := hook().PausedSince
		return !since.IsZero() && time.Since(since) >= 6*time.Second
	})
	during := hook()
	if !strings.Contains(during.PausedBy, "connection refused") {
		t.Errorf("paused by %q, want the refused connection", during.PausedBy)
	}
	if g, _ := getGraph(t, web.NewHandler(rt, nil)); g.node(t, "sink.hook").Paused == nil ||
		!strings.Contains(g.node(t, "sink.hook").Paused.Reason, "connection refused") {
		t.Errorf("/api/graph does not show the sink paused: %+v", g.node(t, "sink.hook"))
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(ln) }()
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if dups := tally(t, rc.received(), n); dups > 0 {
		t.Errorf("%d messages delivered twice", dups)
	}
	s := summaryNode(summary, "hook")
	if s.DeadLettered != 0 {
		t.Errorf("%d messages dead-lettered during a 6s outage", s.DeadLettered)
	}
	// At most every lane's message in flight when the service went away (2 partitions x 8
	// lanes), then one probe at a time: about 6 in 6 seconds of backoff.
	if during.FailedAttempts > 16+10 {
		t.Errorf("%d failed attempts during the outage: the sink did not pause", during.FailedAttempts)
	}
	if paused, resumed := strings.Count(log.String(), "attempts fail transiently"), strings.Count(log.String(), "attempts succeed again"); paused != 1 || resumed != 1 {
		t.Errorf("the pause was logged %d times and the resumption %d times, want once each:\n%s", paused, resumed, log.String())
	}
	t.Logf("%d failed attempts during the outage; %d delivered, 0 dead-lettered", during.FailedAttempts, len(rc.received()))
}

// unavailable holds the runs in which test.unavailable's service is away.
var unavailable sync.Map

func init() {
	// test.unavailable fails with a transient error while its run's service is away, as a Go stage
	// calling a service that is down would.
	stages.Register("test.unavailable", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		if _, away := unavailable.Load(fmt.Sprint(m.Value["run"])); away {
			return nil, stages.Transient(errors.New("the inventory service is unavailable"))
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
}

// TestGoStageWaitsOutTransientFailures: a Go stage whose function returns stages.Transient errors
// pauses until its service is back instead of dead-lettering, without a retry block or with one that
// says "without limit" (max_attempts = 0, with a max_elapsed); with a limited policy, the messages
// that probe the service still run out of attempts.
func TestGoStageWaitsOutTransientFailures(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, retry string
		limited     bool
	}{
		{"default", "", false},
		{"no limit", `retry = retry.forever`, false},
		{"limited", `retry = retry.twice`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
			unavailable.Store(run, true)
			plan := buildSource(t, fmt.Sprintf(`
pipeline "transient" {}
retry "forever" {
  max_attempts = 0
  max_elapsed  = "10m"
  initial      = "10ms"
  max          = "50ms"
}
retry "twice" {
  max_attempts = 2
  initial      = "10ms"
  max          = "50ms"
}
topic "in" { partitions = 2 }
source "gen" {
  kind     = "generate"
  count    = 100
  output   = topic.in
  template = { i = index, run = %q }
}
stage "reserve" {
  kind  = "go"
  func  = "test.unavailable"
  input = topic.in
  %s
}
sink "out" {
  kind  = "stdout"
  input = stage.reserve
}
`, run, c.retry))
			var stdout, log syncBuffer
			rt, err := runtime.New(plan, runtime.Options{Redis: server.open(t), UntilDrained: true, Stdout: &stdout, Logger: newLogger(&log)})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			var summary *runtime.Summary
			go func() {
				var err error
				summary, err = rt.Run(deadline(t))
				done <- err
			}()
			waitFor(t, "the stage to pause and probe", func() bool {
				s := summaryNode(&runtime.Summary{Nodes: rt.Snapshot().Nodes}, "reserve")
				return !s.PausedSince.IsZero() && s.FailedAttempts >= 4 && (!c.limited || s.DeadLettered > 0)
			})
			unavailable.Delete(run)
			if err := <-done; err != nil {
				t.Fatalf("%v\n%s", err, log.String())
			}
			s := summaryNode(summary, "reserve")
			if os.Getenv("SHOW_LOG") != "" {
				t.Log(log.String())
			}
			// Which messages passed and which were dead-lettered, by number: each of the 100 once,
			// in one or the other.
			seen := map[int]int{}
			passed := 0
			for _, m := range jsonLines(t, stdout.String()) {
				seen[int(m["i"].(float64))]++
				passed++
			}
			dead, err := server.open(t).Universal().XRange(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.DeadLetter("reserve"), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range dead {
				env := jsonObject(t, d.Values["payload"].(string))
				seen[int(env["payload"].(map[string]any)["i"].(float64))]++
			}
			t.Logf("%s: %d failed attempts, %d dead-lettered, %d passed", c.name, s.FailedAttempts, s.DeadLettered, passed)
			if dups := tally(t, seen, 100); dups > 0 {
				t.Errorf("%d messages passed or were dead-lettered more than once", dups)
			}
			if int(s.DeadLettered) != len(dead) {
				t.Errorf("the summary counts %d dead letters, the stream holds %d", s.DeadLettered, len(dead))
			}
			if c.limited {
				if len(dead) == 0 {
					t.Errorf("%d passed and none was dead-lettered, want some dead letters", passed)
				}
				return
			}
			if len(dead) != 0 || passed != 100 {
				t.Errorf("%d passed and %d dead-lettered, want 100 and none", passed, len(dead))
			}
		})
	}
}

// TestSourceDeadLettersSayWhereTheyCameFrom feeds a file source lines that cannot be messages (not
// JSON, not UTF-8, longer than max_message_size) and a redis_stream source an entry that is not
// JSON: each becomes a dead letter that names the file and line, or the stream, and the good
// lines around them pass.
func TestSourceDeadLettersSayWhereTheyCameFrom(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "in.jsonl")
	long := `{"pad":"` + strings.Repeat("x", 2000) + `"}`
	writeFile(t, input, "{\"n\":1}\nnot json\n\n{\"n\":\"caf\xe9\"}\n"+long+"\n{\"n\":2}\n")
	external := fmt.Sprintf("external-%d", prefixes.Add(1))
	plan := buildSource(t, fmt.Sprintf(`
pipeline "where" {
  max_message_size = "1KiB"
}
variable "path" {}
topic "in" {}
source "lines" {
  kind   = "file"
  path   = var.path
  output = topic.in
}
source "events" {
  kind   = "redis_stream"
  stream = %q
  output = topic.in
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`, external), "path="+input)
	if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: external, Values: []any{"payload", `{"n":`}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: external, Values: []any{"payload", `{"n":3}`}}).Err(); err != nil {
		t.Fatal(err)
	}
	j := runJob(t, c, plan, runtime.Options{})
	sameMessages(t, "passed", jsonLines(t, j.stdout), []map[string]any{{"n": 1.0}, {"n": 2.0}, {"n": 3.0}})
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	envelopes := func(node string) []map[string]any {
		dead, err := c.Universal().XRange(ctx, keys.DeadLetter(node), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []map[string]any
		for _, d := range dead {
			out = append(out, jsonObject(t, d.Values["payload"].(string)))
		}
		return out
	}
	lines := envelopes("lines")
	if len(lines) != 3 {
		t.Fatalf("%d dead letters of the file source, want 3: %v", len(lines), lines)
	}
	for i, want := range []struct {
		line   float64
		reason string
	}{{2, "not valid JSON"}, {4, "UTF-8"}, {5, "max_message_size"}} {
		env := lines[i]
		if env["file"] != input || env["line"] != want.line || !strings.Contains(env["error"].(string), want.reason) ||
			!strings.Contains(env["error"].(string), fmt.Sprintf("%s:%d", input, int(want.line))) {
			t.Errorf("dead letter %d = %v, want line %v of %s, %q", i, env, want.line, input, want.reason)
		}
	}
	events := envelopes("events")
	if len(events) != 1 || events[0]["stream"] != external || !strings.Contains(events[0]["error"].(string), "not valid JSON") {
		t.Errorf("dead letters of the redis_stream source = %v, want one naming %s", events, external)
	}
}
