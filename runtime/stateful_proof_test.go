package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
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

// The counting input: message i has the key k<i % countingKeys>, its number i and an event time of
// countingBase plus i tenths of a second, so that each key has ten messages in each 10s window and
// every partition closes windows all the time.
const (
	countingKeys = 10
	countingStep = 100                      // ms of event time from one message to the next
	countingSize = 10_000                   // ms: the windows' size
	countingBase = int64(1_700_000_000_000) // a whole number of windows after the epoch
)

// countingStage counts each key's messages per 10s window, and sums their numbers so that a message
// counted in the wrong window shows too. Only events move the watermark (idle_timeout = "0s"), so
// which windows are closed does not depend on how long a test takes.
const countingStage = `
stage "count" {
  kind         = "aggregate"
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

// publishCounting publishes the counting input's messages from..to-1 to the topic in.
func publishCounting(t *testing.T, c *redis.Client, plan *flow.Plan, from, to int) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		body := fmt.Sprintf(`{"k":"k%d","i":%d,"at":%d}`, i%countingKeys, i, countingAt(i))
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(body), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func countingAt(i int) int64 { return countingBase + int64(i)*countingStep }

// windowID is a group's window, by its start in Unix ms.
type windowID struct {
	key   string
	start int64
}

// windowCount is a window's result: its count and the sum of its numbers.
type windowCount struct{ n, sum int64 }

// countingWant computes the results of the counting input's messages from..to-1; closed, when set,
// keeps only the windows it says are closed.
func countingWant(from, to int, closed func(w windowID) bool) map[windowID]windowCount {
	want := map[windowID]windowCount{}
	for i := from; i < to; i++ {
		at := countingAt(i)
		w := windowID{fmt.Sprintf("k%d", i%countingKeys), at - at%countingSize}
		if closed != nil && !closed(w) {
			continue
		}
		c := want[w]
		want[w] = windowCount{c.n + 1, c.sum + int64(i)}
	}
	return want
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
// was committed with their acks. 100 cycles on the single server; 25 on the cluster, whose
// processes take longer to start and whose commits write a batch's outputs before its acks, the
// crash window that effectively-once markers close.
func TestAggregateCountsExactlyThroughKillCycles(t *testing.T) {
	cycles := map[string]int{"server": 100, "cluster": 25}
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
					publishCounting(t, c, plan, published, published+2000)
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
			last := startBinary(t, bin, append(args, "--until-drained")...)
			if err := waitProcess(t, last); err != nil {
				t.Fatalf("the last process, run as a job to the end: %v\n%s", err, last.log.String())
			}
			logs = append(logs, last.log.String())

			got, repeated := windowResults(t, streamPayloads(t, c, out))
			if repeated > 0 {
				t.Errorf("%d window results written more than once", repeated)
			}
			want := countingWant(0, published, nil)
			sameCounts(t, "the results after the kill cycles", got, want)
			if midBatch == 0 {
				t.Error("no kill struck a batch in flight: nothing was killed mid-stream")
			}
			// Every window closed and was forgotten: the state holds the watermarks, no window, no timer.
			for p := 0; p < 4; p++ {
				state, err := c.Universal().HGetAll(ctx, keys.State("in", p, "count")).Result()
				if err != nil {
					t.Fatal(err)
				}
				timers, err := c.Universal().ZCard(ctx, keys.Timers("in", p, "count")).Result()
				if err != nil {
					t.Fatal(err)
				}
				if delete(state, redis.WatermarkField); len(state) > 0 || timers > 0 {
					t.Errorf("partition %d keeps %d state fields and %d timers after the job", p, len(state), timers)
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
			} `json:"nodes"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "job summary" {
			continue
		}
		nodes := map[string]runtime.NodeSummary{}
		for _, n := range rec.Nodes {
			nodes[n.Node] = runtime.NodeSummary{Name: n.Node, In: n.In, Out: n.Out, DeadLettered: n.DeadLettered}
		}
		return nodes
	}
	t.Fatalf("no job summary in the log:\n%s", log)
	return nil
}

// TestTakeoverContinuesOpenWindows: process A counts the first part of the input and stops (SIGTERM,
// or SIGKILL) while every key has a window open; process B, started fresh as a job, counts the
// rest. B reads only the entries A had not acknowledged (none: it counts the second part alone,
// from its job summary) and yet emits the windows that were open with A's counts in them: its
// state was in Redis all along, with nothing to restore. The results equal those of one process
// that counts everything, and the computation in the test.
func TestTakeoverContinuesOpenWindows(t *testing.T) {
	// The split falls in the middle of a window, 105s into the input.
	const n, split = 2000, 1050
	bin := flowrunBinary(t)
	want := countingWant(0, n, nil)
	spanning := 0
	for w := range want {
		if w.start < countingAt(split) && countingAt(split) < w.start+countingSize {
			spanning++
		}
	}
	if spanning == 0 {
		t.Fatal("no window spans the split: the test would not see an open window move")
	}
	for _, b := range processBackends {
		for _, stop := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
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

				publishCounting(t, c, plan, 0, split)
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

				publishCounting(t, c, plan, split, n)
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
				publishCounting(t, c, single, 0, n)
				runJob(t, c, single, runtime.Options{})
				alone, _ := windowResults(t, streamPayloads(t, c, singleOut))
				sameCounts(t, "the results of a and b, against one process", got, alone)
			})
		}
	}
}
