package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Proofs that stateful processing loses and duplicates nothing (issue 14, point 7), on a real
// redis-server and on a 3-master Redis Cluster: exact window counts through SIGKILLs, a sink that
// fails while windows fire, idle partitions, late events and a takeover by another process. A
// window's state lives in its input partition's hash slot and changes in one fenced step with the
// acks of the entries it was computed from, so none of this needs anything restored.

// event is a message of a test's input: its key, its number and its event time in Unix ms.
type event struct {
	key string
	i   int
	at  int64
}

// publishEvents publishes events to the topic in, in order.
func publishEvents(t *testing.T, c *redis.Client, plan *flow.Plan, events []event) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		body := fmt.Sprintf(`{"k":%q,"i":%d,"at":%d}`, e.key, e.i, e.at)
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(body), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// windowID is a group's window, by its start in Unix ms.
type windowID struct {
	key   string
	start int64
}

// windowCount is a window's result: its count and the sum of its numbers.
type windowCount struct{ n, sum int64 }

// countWindows computes the results of tumbling windows of size ms over events, none late.
func countWindows(events []event, size int64) map[windowID]windowCount {
	want := map[windowID]windowCount{}
	for _, e := range events {
		w := windowID{e.key, e.at - e.at%size}
		c := want[w]
		want[w] = windowCount{c.n + 1, c.sum + int64(e.i)}
	}
	return want
}

// The counting input: message i has the key k<i % countingKeys>, its number i and an event time of
// countingBase plus i tenths of a second, so that each key has ten messages in each 10s window and
// every partition closes windows all the time.
const (
	countingKeys = 10
	countingStep = 100                      // ms of event time from one message to the next
	countingSize = 10_000                   // ms: the windows' size
	countingBase = int64(1_700_000_000_000) // a whole number of windows after the epoch
)

// countingEvents are the counting input's messages from..to-1.
func countingEvents(from, to int) []event {
	var events []event
	for i := from; i < to; i++ {
		events = append(events, event{fmt.Sprintf("k%d", i%countingKeys), i, countingAt(i)})
	}
	return events
}

func countingAt(i int) int64 { return countingBase + int64(i)*countingStep }

// countingStage counts each key's messages per 10s window, and sums their numbers so that a message
// counted in the wrong window shows too. Only events move the watermark (idle_timeout = "0s"), so
// which windows are closed does not depend on how long a test takes.
const countingStage = `
stage "count" {
  kind         = "aggregate"
  group_by = msg.k
  input        = topic.in
  output       = topic.counts
  event_time   = msg.at
  idle_timeout = "0s"
  window {
    type = "tumbling"
    size = "10s"
  }
  aggregate = {
    n   = count()
    sum = sum(msg.i)
  }
}
`

// countingPipeline runs countingStage with effectively-once delivery into the stream out, for a
// flowrun process that the test starts (so the key prefix is in the file).
func countingPipeline(prefix, out string) string {
	return fmt.Sprintf(`
pipeline "counting" {
  key_prefix = %q
  delivery   = "effectively_once"
}
topic "in" {
  partitions = 4
  key        = msg.k
}
# The cap keeps the aggregate's reads small (a stage reads no more than the cap of the topics it
# writes): many small batches, so that a kill lands in the middle of one.
topic "counts" {
  partitions = 4
  max_lag    = 50
}
%s
sink "out" {
  kind   = "redis_stream"
  input  = topic.counts
  stream = %q
}
`, prefix, countingStage, out)
}

// windowResults decodes aggregate results (fields n and sum) by window, and counts the results
// that repeat a window.
func windowResults(t *testing.T, msgs []map[string]any) (got map[windowID]windowCount, repeated int) {
	t.Helper()
	got = map[windowID]windowCount{}
	for _, m := range msgs {
		w, ok := m["window"].(map[string]any)
		start, err := time.Parse(time.RFC3339Nano, fmt.Sprint(w["start"]))
		n, nOK := m["n"].(float64)
		sum, sumOK := m["sum"].(float64)
		if !ok || err != nil || !nOK || !sumOK {
			t.Fatalf("not a window result: %v", m)
		}
		id := windowID{fmt.Sprint(m["key"]), start.UnixMilli()}
		if _, seen := got[id]; seen {
			repeated++
		}
		got[id] = windowCount{int64(n), int64(sum)}
	}
	return got, repeated
}

// sameCounts reports every window whose result is missing, unexpected or wrong.
func sameCounts(t *testing.T, what string, got, want map[windowID]windowCount) {
	t.Helper()
	var diffs []string
	for w, c := range want {
		switch g, ok := got[w]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s at %d: missing, want %+v", w.key, w.start, c))
		case g != c:
			diffs = append(diffs, fmt.Sprintf("%s at %d: %+v, want %+v", w.key, w.start, g, c))
		}
	}
	for w, g := range got {
		if _, ok := want[w]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s at %d: %+v, not expected", w.key, w.start, g))
		}
	}
	if n := len(diffs); n > 0 {
		if n > 20 {
			diffs = append(diffs[:20], fmt.Sprintf("... %d more", n-20))
		}
		t.Errorf("%s: %d windows differ (of %d expected):\n%s", what, n, len(want), strings.Join(diffs, "\n"))
	}
}

// streamPayloads reads the payloads of every entry of a stream.
func streamPayloads(t *testing.T, c *redis.Client, stream string) []map[string]any {
	t.Helper()
	var out []map[string]any
	after := "0"
	for {
		recs, err := c.Read(context.Background(), stream, after, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return out
		}
		for _, r := range recs {
			out = append(out, jsonObject(t, string(r.Payload)))
			after = r.ID
		}
	}
}

// topicPayloads reads the payloads of every partition of a topic.
func topicPayloads(t *testing.T, c *redis.Client, keys redis.Keys, topic string, partitions int) []map[string]any {
	t.Helper()
	var out []map[string]any
	for p := 0; p < partitions; p++ {
		out = append(out, streamPayloads(t, c, keys.Stream(topic, p))...)
	}
	return out
}

// openWindows returns the windows that a stage's state holds, over a topic's partitions.
func openWindows(t *testing.T, c *redis.Client, keys redis.Keys, topic string, partitions int, stage string) map[windowID]bool {
	t.Helper()
	open := map[windowID]bool{}
	for p := 0; p < partitions; p++ {
		fields, err := c.Universal().HKeys(context.Background(), keys.State(topic, p, stage)).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			group, start, ok := strings.Cut(strings.TrimPrefix(f, "w:"), "\x00")
			if !ok || !strings.HasPrefix(f, "w:") {
				continue // the watermark
			}
			var ms int64
			if _, err := fmt.Sscan(start, &ms); err != nil {
				t.Fatalf("state field %q: %v", f, err)
			}
			open[windowID{group, ms}] = true
		}
	}
	return open
}

// mostDelivered returns the largest delivery count of the entries pending for a group on the given
// streams: an entry delivered more than poisonDeliveries (5) times is dead-lettered as a poison
// message, which a test that kills processes must not provoke by killing them too fast.
func mostDelivered(t *testing.T, c *redis.Client, group string, streams ...string) int64 {
	t.Helper()
	var most int64
	for _, s := range streams {
		pend, err := c.Universal().XPendingExt(context.Background(), &goredis.XPendingExtArgs{
			Stream: s, Group: group, Start: "-", End: "+", Count: 1 << 20,
		}).Result()
		if err != nil && !strings.Contains(err.Error(), "NOGROUP") {
			t.Fatal(err)
		}
		for _, p := range pend {
			most = max(most, p.RetryCount)
		}
	}
	return most
}

// redisArgs are the --redis flags of a flowrun process for a backend's URLs.
func redisArgs(urls []string) []string {
	var args []string
	for _, u := range urls {
		args = append(args, "--redis", u)
	}
	return args
}

// processBackends are the backends a flowrun process runs on.
var processBackends = []struct {
	name string
	urls func(t *testing.T) []string
}{
	{"server", func(t *testing.T) []string { return []string{redistest.Shared(t).URL()} }},
	{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t, 3).URLs() }},
}

// TestAggregateCountsExactlyThroughKillCycles runs the counting aggregate with effectively-once
// delivery in a flowrun process that is killed with SIGKILL and started again, cycle after cycle,
// and then runs it to the end as a job: the output holds exactly one result per key and window,
// with exactly the count and sum of its messages. Each cycle kills the process once it has
// counted a random number of entries more (seen in Redis), mostly with batches in flight; the
// next process takes the partitions over when the killed one's leases expire (--lease-ttl
// 300ms), reads the entries the killed one left pending again, and goes on from the state that
// was committed with their acks. 100 cycles on the single server and on the cluster, whose
// commits write a batch's outputs before its acks: the crash window that effectively-once markers
// close.
func TestAggregateCountsExactlyThroughKillCycles(t *testing.T) {
	t.Parallel()
	cycles := map[string]int{"server": 100, "cluster": 100}
	bin := flowrunBinary(t)
	for _, b := range processBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			urls := b.urls(t)
			c := openURLs(t, urls...)
			prefix := fmt.Sprintf("killcount-%d", prefixes.Add(1))
			out := prefix + ":out"
			path := filepath.Join(t.TempDir(), "counting.hcl")
			writeFile(t, path, countingPipeline(prefix, out))
			plan, _, diags := flow.Build(path, flow.Options{})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			keys := redis.Keys{Prefix: prefix}
			inputs, counts := keys.Streams("in", 4), keys.Streams("counts", 4)
			backlog := func() int {
				n := 0
				for _, s := range inputs {
					n += int(backlogOf(t, c, s, "count"))
				}
				return n
			}
			args := append([]string{"run", path, "--lease-ttl", "300ms"}, redisArgs(urls)...)

			started := time.Now()
			published, midBatch, inFlight := 0, 0, 0
			var logs []string
			for cycle := 0; cycle < cycles[b.name]; cycle++ {
				// The input is published as it is needed, so that no cycle finds it all counted.
				if backlog() < 1000 {
					publishEvents(t, c, plan, countingEvents(published, published+2000))
					published += 2000
				}
				before, progress := backlog(), 1+rand.IntN(200)
				p := startBinary(t, bin, args...)
				waitFor(t, fmt.Sprintf("cycle %d: %d more entries counted", cycle, progress), func() bool {
					// No entry in flight has been delivered more than twice: the next process, which
					// delivers them again, stays clear of the poison-message limit.
					return before-backlog() >= progress &&
						mostDelivered(t, c, "count", inputs...) <= 2 && mostDelivered(t, c, "out", counts...) <= 2
				})
				p.kill(t)
				// What the killed process had read and not acknowledged, in both hops.
				if n := pendingFor(t, c, keys, "in", 4, "count", "") + pendingFor(t, c, keys, "counts", 4, "out", ""); n > 0 {
					midBatch++
					inFlight += n
				}
				logs = append(logs, p.log.String())
			}
			// The job's exit status is 0 only if nothing was dead-lettered (a poison message would be).
			last := startBinary(t, bin, append(args, "--until-drained")...)
			if err := waitProcess(t, last); err != nil {
				t.Fatalf("the last process, run as a job to the end: %v\n%s", err, last.log.String())
			}
			logs = append(logs, last.log.String())

			got, repeated := windowResults(t, streamPayloads(t, c, out))
			if repeated > 0 {
				t.Errorf("%d window results written more than once", repeated)
			}
			want := countWindows(countingEvents(0, published), countingSize)
			sameCounts(t, "the results after the kill cycles", got, want)
			if midBatch == 0 {
				t.Error("no kill struck a batch in flight: nothing was killed mid-stream")
			}
			// Every window closed and was forgotten: the state holds the watermark and a count of
			// groups with open windows that is back to 0, exact through the kills; no window, no timer.
			for p := 0; p < 4; p++ {
				state, err := c.Universal().HGetAll(ctx, keys.State("in", p, "count")).Result()
				if err != nil {
					t.Fatal(err)
				}
				timers, err := c.Universal().ZCard(ctx, keys.Timers("in", p, "count")).Result()
				if err != nil {
					t.Fatal(err)
				}
				if count := state[stages.KeyCountKey]; count != "0" {
					t.Errorf("partition %d: %q groups with open windows after the job, want 0", p, count)
				}
				delete(state, stages.KeyCountKey)
				if delete(state, redis.WatermarkField); len(state) > 0 || timers > 0 {
					t.Errorf("partition %d keeps %d state fields and %d timers after the job: %q", p, len(state), timers, slices.Sorted(maps.Keys(state)))
				}
			}
			t.Logf("%d SIGKILL cycles over %d messages in %s: %d kills with batches in flight (%d entries), %d results, %d leases lost",
				cycles[b.name], published, time.Since(started).Round(time.Millisecond), midBatch, inFlight, len(got), leaseLosses(logs...))
		})
	}
}

// jobSummary reads the node counts of the job summary that flowrun run --log-format json logs.
func jobSummary(t *testing.T, log string) map[string]runtime.NodeSummary {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		var rec struct {
			Msg   string `json:"msg"`
			Nodes []struct {
				Node         string `json:"node"`
				In           int64  `json:"in"`
				Out          int64  `json:"out"`
				DeadLettered int64  `json:"dead_lettered"`
				Late         int64  `json:"late"`
			} `json:"nodes"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "job summary" {
			continue
		}
		nodes := map[string]runtime.NodeSummary{}
		for _, n := range rec.Nodes {
			nodes[n.Node] = runtime.NodeSummary{Name: n.Node, In: n.In, Out: n.Out, DeadLettered: n.DeadLettered, Late: n.Late}
		}
		return nodes
	}
	t.Fatalf("no job summary in the log:\n%s", log)
	return nil
}

// TestTakeoverContinuesOpenWindows: process A counts the first part of the input and stops (SIGTERM
// on the server, SIGKILL on the cluster) while every key has a window open; process B, started fresh as a job, counts the
// rest. B reads only the entries A had not acknowledged (none: it counts the second part alone,
// from its job summary) and yet emits the windows that were open with A's counts in them: its
// state was in Redis all along, with nothing to restore. The results equal those of one process
// that counts everything, and the computation in the test.
func TestTakeoverContinuesOpenWindows(t *testing.T) {
	t.Parallel()
	// The split falls in the middle of a window, 105s into the input.
	const n, split = 2000, 1050
	bin := flowrunBinary(t)
	want := countWindows(countingEvents(0, n), countingSize)
	spanning := 0
	for w := range want {
		if w.start < countingAt(split) && countingAt(split) < w.start+countingSize {
			spanning++
		}
	}
	if spanning == 0 {
		t.Fatal("no window spans the split: the test would not see an open window move")
	}
	// A stops cleanly (and releases its leases) on the server, and is killed on the cluster (B waits
	// for its leases to expire): each costs a few seconds, and what B finds in Redis is the same.
	stops := map[string]syscall.Signal{"server": syscall.SIGTERM, "cluster": syscall.SIGKILL}
	for _, b := range processBackends {
		stop := stops[b.name]
		t.Run(b.name+"/"+stop.String(), func(t *testing.T) {
			urls := b.urls(t)
			c := openURLs(t, urls...)
			prefix := fmt.Sprintf("takeover-%d", prefixes.Add(1))
			out := prefix + ":out"
			path := filepath.Join(t.TempDir(), "counting.hcl")
			writeFile(t, path, countingPipeline(prefix, out))
			plan, _, diags := flow.Build(path, flow.Options{})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			keys := redis.Keys{Prefix: prefix}
			args := append([]string{"run", path, "--lease-ttl", "1s"}, redisArgs(urls)...)

			publishEvents(t, c, plan, countingEvents(0, split))
			a := startBinary(t, bin, args...)
			waitFor(t, "process a to count the first part", func() bool {
				for _, s := range keys.Streams("in", 4) {
					if backlogOf(t, c, s, "count") > 0 {
						return false
					}
				}
				return true
			})
			if open := openWindows(t, c, keys, "in", 4, "count"); len(open) != countingKeys {
				t.Fatalf("%d windows open after the first part, want one per key: %v", len(open), open)
			}
			if err := a.cmd.Process.Signal(stop); err != nil {
				t.Fatal(err)
			}
			if err := waitProcess(t, a); stop == syscall.SIGTERM && err != nil {
				t.Fatalf("process a did not stop cleanly: %v\n%s", err, a.log.String())
			}

			publishEvents(t, c, plan, countingEvents(split, n))
			b := startBinary(t, bin, append(args, "--until-drained", "--log-format", "json")...)
			if err := waitProcess(t, b); err != nil {
				t.Fatalf("process b: %v\n%s", err, b.log.String())
			}
			if in := jobSummary(t, b.log.String())["count"].In; in != n-split {
				t.Errorf("process b counted %d entries, want the %d of the second part", in, n-split)
			}
			got, repeated := windowResults(t, streamPayloads(t, c, out))
			if repeated > 0 {
				t.Errorf("%d window results written more than once", repeated)
			}
			sameCounts(t, "the results of a and b", got, want)

			// The same input counted by one process, to the end (buildSource gives it a key prefix of
			// its own).
			singleOut := prefix + ":single"
			single := buildSource(t, countingPipeline(prefix, singleOut))
			publishEvents(t, c, single, countingEvents(0, n))
			runJob(t, c, single, runtime.Options{})
			alone, _ := windowResults(t, streamPayloads(t, c, singleOut))
			sameCounts(t, "the results of a and b, against one process", got, alone)
		})
	}
}

// resultHook is an HTTP service for window results: while it is down it answers 503 to every
// request (and counts them); once up it accepts them.
type resultHook struct {
	mu       sync.Mutex
	up       bool
	refused  int
	accepted []map[string]any
}

func (h *resultHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var m map[string]any
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.up {
		h.refused++
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return
	}
	h.accepted = append(h.accepted, m)
}

func (h *resultHook) state() (refused int, accepted []map[string]any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refused, slices.Clone(h.accepted)
}

func (h *resultHook) recover() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.up = true
}

// TestWindowResultsWaitOutAFailingSink runs the counting aggregate as a service into an http sink
// whose service answers 503 from the start: the first window results fail as their windows close,
// and the sink pauses. The results wait in the aggregate's output topic while the windows' state is
// already gone (the result is written before the state is deleted, in the same commit); once the
// service is back, every closed window's result arrives, with its exact count. An http sink delivers at least once:
// a result could arrive twice only if a delivery's ack was lost (a lost lease), so without one each
// arrives exactly once.
func TestWindowResultsWaitOutAFailingSink(t *testing.T) {
	const n = 1000
	events := countingEvents(0, n)
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			hook := &resultHook{}
			svc := httptest.NewServer(hook)
			defer svc.Close()
			plan := buildSource(t, fmt.Sprintf(`
pipeline "hook" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
topic "counts" {
  partitions = 2
}
%s
sink "hook" {
  kind  = "http"
  input = topic.counts
  url   = "%s/counts"
}
`, countingStage, svc.URL))
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			// The windows that the events close: those that end at or before the watermark of their
			// key's partition, the latest event time there. The last window of each key stays open.
			watermarks := map[int]int64{}
			for _, e := range events {
				p := redis.Partition(e.key, 2)
				watermarks[p] = max(watermarks[p], e.at)
			}
			want, open := map[windowID]windowCount{}, map[windowID]bool{}
			for w, count := range countWindows(events, countingSize) {
				if w.start+countingSize <= watermarks[redis.Partition(w.key, 2)] {
					want[w] = count
				} else {
					open[w] = true
				}
			}
			publishEvents(t, c, plan, events)

			run := runInBackground(t, plan, runtime.Options{Redis: c})
			waitFor(t, "every closed window's result in the topic, and the service to refuse them", func() bool {
				// On a cluster a batch's outputs go before its acks and state: the input is acked once
				// the state is written too.
				for _, s := range keys.Streams("in", 2) {
					if backlogOf(t, c, s, "count") > 0 {
						return false
					}
				}
				refused, _ := hook.state()
				return len(topicPayloads(t, c, keys, "counts", 2)) == len(want) && refused > 0
			})
			if _, accepted := hook.state(); len(accepted) > 0 {
				t.Fatalf("the service accepted %d results while it was down", len(accepted))
			}
			// The closed windows are gone from the state: their results are in the topic alone.
			if got := openWindows(t, c, keys, "in", 2, "count"); !maps.Equal(got, open) {
				t.Fatalf("the state holds the windows %v, want the open ones %v", got, open)
			}
			hook.recover()
			waitFor(t, "every result to arrive once the service is back", func() bool {
				_, accepted := hook.state()
				got, _ := windowResults(t, accepted)
				return len(got) == len(want)
			})
			if err := run.stop(); err != nil {
				t.Fatalf("%v\n%s", err, run.log.String())
			}
			refused, accepted := hook.state()
			got, repeated := windowResults(t, accepted)
			sameCounts(t, "the results that arrived", got, want)
			if losses := leaseLosses(run.log.String()); repeated > 0 && losses == 0 {
				t.Errorf("%d results arrived twice, with no lease lost", repeated)
			}
			if s := summaryNode(run.summary, "hook"); s.DeadLettered != 0 {
				t.Errorf("the sink dead-lettered %d results", s.DeadLettered)
			}
			t.Logf("%d results refused with 503 while their windows closed; %d arrived afterwards", refused, len(accepted))
		})
	}
}

// TestIdlePartitionsCloseTheirLastWindows runs an aggregate as a service on a real Redis: when the
// events stop, each partition's last window closes once it has been idle for idle_timeout, its
// watermark moving by the time that passes on the clock, not to the clock's time (the events are
// from 2020): an event that comes an hour of event time later is in time, and its window closes the
// same way. (examples/pipelines/revenue/tests/idle.flowtest.hcl shows the same on the embedded Redis
// and a virtual clock.)
func TestIdlePartitionsCloseTheirLastWindows(t *testing.T) {
	t.Parallel()
	const base = int64(1_577_836_800_000) // 2020-01-01T00:00:00Z
	// Two keys in each partition.
	var keyNames []string
	for p := 0; p < 2; p++ {
		for i, found := 0, 0; found < 2; i++ {
			if k := fmt.Sprintf("k%d", i); redis.Partition(k, 2) == p {
				keyNames = append(keyNames, k)
				found++
			}
		}
	}
	// Events a tenth of a second apart for 1.9s: each key's first window closes by the events, its
	// second, which the events end 100 to 200ms before its end, only when the partition is idle.
	var first, later []event
	for i := 0; i < 19; i++ {
		first = append(first, event{keyNames[i%4], i, base + int64(i)*100})
	}
	for i := 19; i < 23; i++ {
		later = append(later, event{keyNames[i-19], i, base + time.Hour.Milliseconds() + int64(i-19)*100})
	}
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			out := fmt.Sprintf("idle-%d:out", prefixes.Add(1))
			plan := buildSource(t, fmt.Sprintf(`
pipeline "idle" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
stage "count" {
  kind         = "aggregate"
  group_by = msg.k
  input        = topic.in
  event_time   = msg.at
  idle_timeout = "1s"
  window {
    type = "tumbling"
    size = "1s"
  }
  aggregate = {
    n   = count()
    sum = sum(msg.i)
  }
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.count
  stream = %q
}
`, out))
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			watermark := func(p int) int64 {
				v, err := c.Universal().HGet(ctx, keys.State("in", p, "count"), redis.WatermarkField).Int64()
				if err != nil {
					t.Fatalf("the watermark of partition %d: %v", p, err)
				}
				return v
			}
			run := runInBackground(t, plan, runtime.Options{Redis: c})
			check := func(events []event, until int64) {
				t.Helper()
				want := countWindows(events, 1000)
				waitFor(t, fmt.Sprintf("%d windows to close", len(want)), func() bool {
					return int(lengthOf(t, c, out)) == len(want)
				})
				got, repeated := windowResults(t, streamPayloads(t, c, out))
				if repeated > 0 {
					t.Errorf("%d results emitted twice", repeated)
				}
				sameCounts(t, "the windows closed", got, want)
				for p := 0; p < 2; p++ {
					if wm := watermark(p); wm > until {
						t.Errorf("partition %d: watermark %s, past %s: it jumped instead of moving with the clock",
							p, time.UnixMilli(wm).UTC(), time.UnixMilli(until).UTC())
					}
				}
			}
			publishEvents(t, c, plan, first)
			check(first, base+time.Hour.Milliseconds())
			publishEvents(t, c, plan, later)
			check(slices.Concat(first, later), base+2*time.Hour.Milliseconds())
			if err := run.stop(); err != nil {
				t.Fatalf("%v\n%s", err, run.log.String())
			}
			if s := summaryNode(run.summary, "count"); s.Late != 0 || s.DeadLettered != 0 {
				t.Errorf("count: %d late, %d dead-lettered, want none", s.Late, s.DeadLettered)
			}
		})
	}
}

// TestLateEventsGoWhereLateSays runs three aggregates over the same events, some of which come
// behind the watermark: within grace they count, past it they are late, and each stage sends them
// where its late attribute says: dropped (counted as late), dead-lettered (with the reason), or to
// a topic (counted as late). Every stage emits the same windows, without the late events.
func TestLateEventsGoWhereLateSays(t *testing.T) {
	const n, size, grace = 400, int64(10_000), int64(3_000)
	// An event a second, over four keys. Every tenth comes 3.5s behind, at the end of the window
	// before, which has just ended (within grace); every tenth but four comes 15s behind, for a
	// window that ended more than grace before (late).
	var events []event
	for i := 0; i < n; i++ {
		behind := map[int]int64{3: 3_500, 7: 15_000}[i%10]
		events = append(events, event{fmt.Sprintf("k%d", i%4), i, countingBase + int64(i)*1000 - behind})
	}
	// The computation: per partition, in order, an event is late when its window's end plus grace
	// is at or before the partition's watermark, the latest event time there so far.
	late := map[int]bool{}
	var counted []event
	inGrace := 0
	watermarks := map[int]int64{}
	for _, e := range events {
		p := redis.Partition(e.key, 2)
		watermarks[p] = max(watermarks[p], e.at)
		end := e.at - e.at%size + size
		switch {
		case end+grace <= watermarks[p]:
			late[e.i] = true
			continue
		case end <= watermarks[p]:
			inGrace++
		}
		counted = append(counted, e)
	}
	if len(late) == 0 || inGrace == 0 {
		t.Fatalf("%d late events and %d in grace: the input does not test both", len(late), inGrace)
	}
	want := countWindows(counted, size)

	stage := func(name, late string) string {
		return fmt.Sprintf(`
stage %q {
  kind       = "aggregate"
  group_by = msg.k
  input      = topic.in
  event_time = msg.at
  grace      = "3s"
  late       = %s
  window {
    type = "tumbling"
    size = "10s"
  }
  aggregate = {
    n   = count()
    sum = sum(msg.i)
  }
}
sink "%[1]s_out" {
  kind  = "file"
  input = stage.%[1]s
  path  = "${var.dir}/%[1]s.jsonl"
}
`, name, late)
	}
	src := `
pipeline "late" {}
variable "dir" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
topic "late_events" {
  partitions = 1
}
sink "late_out" {
  kind  = "file"
  input = topic.late_events
  path  = "${var.dir}/late.jsonl"
}
` + stage("dropping", `"drop"`) + stage("dead_lettering", `"dead_letter"`) + stage("routing", "topic.late_events")

	numbers := func(t *testing.T, what string, msgs []map[string]any) {
		t.Helper()
		got := map[int]bool{}
		for _, m := range msgs {
			i, ok := m["i"].(float64)
			if !ok {
				t.Fatalf("%s: not an event: %v", what, m)
			}
			got[int(i)] = true
		}
		if len(msgs) != len(late) || !maps.Equal(got, late) {
			t.Errorf("%s: %d events %v, want the %d late ones %v", what, len(msgs), slices.Sorted(maps.Keys(got)), len(late), slices.Sorted(maps.Keys(late)))
		}
	}
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			dir := t.TempDir()
			plan := buildSource(t, src, "dir="+dir)
			publishEvents(t, c, plan, events)
			j := runJob(t, c, plan, runtime.Options{})
			for _, name := range []string{"dropping", "dead_lettering", "routing"} {
				got, repeated := windowResults(t, jsonLines(t, readFile(t, filepath.Join(dir, name+".jsonl"))))
				if repeated > 0 {
					t.Errorf("%s: %d windows emitted twice", name, repeated)
				}
				sameCounts(t, name, got, want)
			}
			nl := int64(len(late))
			if s := j.node(t, "dropping"); s.Late != nl || s.DeadLettered != 0 {
				t.Errorf("dropping: %d late, %d dead-lettered, want %d late", s.Late, s.DeadLettered, nl)
			}
			if s := j.node(t, "routing"); s.Late != nl || s.DeadLettered != 0 {
				t.Errorf("routing: %d late, %d dead-lettered, want %d late", s.Late, s.DeadLettered, nl)
			}
			numbers(t, "topic late_events", jsonLines(t, readFile(t, filepath.Join(dir, "late.jsonl"))))
			if s := j.node(t, "dead_lettering"); s.DeadLettered != nl {
				t.Errorf("dead_lettering: %d dead-lettered, want the %d late", s.DeadLettered, nl)
			}
			dead, err := c.Universal().XRange(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.DeadLetter("dead_lettering"), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			var payloads []map[string]any
			for _, d := range dead {
				env := jsonObject(t, d.Values["payload"].(string))
				if !strings.HasPrefix(fmt.Sprint(env["error"]), "late: ") {
					t.Errorf("a dead letter's reason: %v", env["error"])
				}
				payload, _ := env["payload"].(map[string]any)
				payloads = append(payloads, payload)
			}
			numbers(t, "dead letters of dead_lettering", payloads)
		})
	}
}
