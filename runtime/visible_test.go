package runtime_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Failures are visible: dead letters are logged (rate-limited) and summed up with their reasons,
// sinks count what they delivered, rates do not depend on who looks, and a redis_stream source shows
// its lag.

// TestDeadLettersAreLoggedAndSummedUp dead-letters every message of a job: each of the first few is
// logged with where it was and why (its secret redacted), the rest are counted in summary lines,
// and the summary keeps the reason and the command that lists them.
func TestDeadLettersAreLoggedAndSummedUp(t *testing.T) {
	const secret = "s3cr3t-t0ken"
	const messages = 100
	plan := buildSource(t, `
pipeline "dl" {}
variable "token" {
  sensitive = true
  default   = "`+secret+`"
}
topic "in" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = `+strconv.Itoa(messages)+`
  output   = topic.in
  template = { k = "k${index % 3}" }
}
stage "check" {
  kind  = "map"
  input = topic.in
  set   = { n = tonumber("${msg.k}${var.token}") }
}
sink "out" {
  kind  = "stdout"
  input = stage.check
}
`)
	const path = "pipes/dl dir"
	j := runJob(t, server.open(t), plan, runtime.Options{PipelinePath: path})
	if n := j.node(t, "check"); n.DeadLettered != messages {
		t.Fatalf("check dead-lettered %d, want %d", n.DeadLettered, messages)
	}
	if strings.Contains(j.log, secret) {
		t.Fatalf("the log shows the secret:\n%s", j.log)
	}

	one := regexp.MustCompile(`level=WARN msg="message dead-lettered" pipeline=dl node=check node_type=stage ` +
		`partition=[01] key=k[0-2] id=\d+-\d+ attempts=1 reason=".*cannot convert \\"k[0-2]\(sensitive\)\\" to number.*" stream=\S+$`)
	more := regexp.MustCompile(`level=WARN msg="(\d+) more dead letters? from stage check in the last \d+s; ` +
		`flowrun dlq list 'pipes/dl dir' --stage check"`)
	logged, counted := 0, 0
	for _, line := range strings.Split(j.log, "\n") {
		if strings.Contains(line, "dead-lettered") && strings.Contains(line, "node=check") {
			if !one.MatchString(line) {
				t.Errorf("a dead letter's line lacks what or why:\n%s", line)
			}
			logged++
		}
		if m := more.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			counted += n
		}
	}
	if logged == 0 || logged >= messages || logged+counted != messages {
		t.Errorf("%d dead letters logged one by one and %d counted in summary lines, want a few and the rest (%d in all):\n%s",
			logged, counted, messages, j.log)
	}

	// The reasons name the key (k0, k1, k2): three distinct ones, which account for every message.
	var sum int64
	for _, r := range j.node(t, "check").Reasons {
		sum += r.Count
		if !strings.Contains(r.Reason, "(sensitive)") {
			t.Errorf("reason %q", r.Reason)
		}
	}
	if n := len(j.node(t, "check").Reasons); n != 3 || sum != messages {
		t.Errorf("check's reasons: %+v", j.node(t, "check").Reasons)
	}
	if j.summary.Path != path {
		t.Errorf("the summary's path is %q, want %q", j.summary.Path, path)
	}
	// How the summary prints these reasons and the command is cmd's: TestSummaryShowsReasonsAndCommand.
}

// TestSinksCountDeliveries: a sink's out is what it delivered, whether it writes to Redis or not,
// and a filtered message is not counted.
func TestSinksCountDeliveries(t *testing.T) {
	var posted atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { posted.Add(1) }))
	defer hook.Close()
	dir := t.TempDir()
	plan := buildSource(t, `
pipeline "deliver" {}
variable "hook" {}
variable "dir" {}
topic "t" { partitions = 2 }
source "gen" {
  kind     = "generate"
  count    = 6
  output   = topic.t
  template = { n = index }
}
sink "screen" {
  kind  = "stdout"
  input = topic.t
  where = msg.n % 2 == 0
}
sink "file" {
  kind  = "file"
  input = topic.t
  path  = "${var.dir}/out.jsonl"
}
sink "stream" {
  kind   = "redis_stream"
  input  = topic.t
  stream = "delivered:${var.dir}"
}
sink "hook" {
  kind  = "http"
  input = topic.t
  url   = var.hook
}
`, "hook="+hook.URL, "dir="+dir)
	j := runJob(t, server.open(t), plan, runtime.Options{})
	for name, want := range map[string][2]int64{"screen": {3, 3}, "file": {6, 0}, "stream": {6, 0}, "hook": {6, 0}} {
		if n := j.node(t, name); n.Out != want[0] || n.Filtered != want[1] {
			t.Errorf("sink %s: out %d, filtered %d; want %d and %d", name, n.Out, n.Filtered, want[0], want[1])
		}
	}
	// The file has each of the 6 messages once (a count alone would let a loss and a repeat
	// cancel out), and the service got 6 requests.
	if dups := tally(t, countBy(t, jsonLines(t, readFile(t, filepath.Join(dir, "out.jsonl"))), "n"), 6); dups > 0 || posted.Load() != 6 {
		t.Errorf("%d lines of the file repeat one, %d requests; want none and 6", dups, posted.Load())
	}
}

// TestRatesDoNotDependOnViewers has two viewers poll /api/graph, one on every round and one every
// seventh: every answer from the same window of samples has the same rates, and the rate over a
// window that covers the whole job is the messages counted over its length.
func TestRatesDoNotDependOnViewers(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	plan := buildTestdata(t, "web.hcl")
	// Samples every 20ms, each rate over every sample taken: the window covers the whole test.
	s := startService(t, c, plan, runtime.Options{}, withRateSampling(20*time.Millisecond, 1<<20))
	h := web.NewHandler(s.rt, nil)

	type seen struct {
		since   string
		seconds float64
		rates   map[string]float64
	}
	windows := map[string]seen{} // by the window's end
	shared := 0                  // windows that both viewers saw
	viewers := map[string]map[string]bool{"fast": {}, "slow": {}}
	view := func(who string) graphDoc {
		g, _ := getGraph(t, h)
		if g.Rates.Until == nil {
			return g
		}
		v := seen{since: *g.Rates.Since, seconds: g.Rates.Seconds, rates: map[string]float64{}}
		for _, e := range g.Edges {
			if e.Rate != nil {
				v.rates[e.From+">"+e.To] = *e.Rate
			}
		}
		until := *g.Rates.Until
		if before, ok := windows[until]; ok && (before.since != v.since || !maps.Equal(before.rates, v.rates)) {
			t.Errorf("the window ending %s: %+v, then %+v", until, before, v)
		}
		windows[until] = v
		viewers[who][until] = true
		if viewers["fast"][until] && viewers["slow"][until] && who == "slow" {
			shared++
		}
		return g
	}
	round := 0
	poll := func() graphDoc {
		round++
		g := view("fast")
		if round%7 == 0 {
			view("slow")
		}
		return g
	}

	// The window starts with a sample taken before anything was published.
	waitFor(t, "two samples", func() bool { return poll().Rates.Since != nil })
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(fmt.Sprintf(`{"i":%d}`, i)), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var done time.Time
	waitFor(t, "the ten messages through", func() bool {
		poll()
		if nodeIn(s.rt.Snapshot(), "out") == 10 {
			done = time.Now()
			return true
		}
		return false
	})
	var g graphDoc
	waitFor(t, "a window that ends after the work and a window both viewers saw", func() bool {
		g = poll()
		until, err := time.Parse(time.RFC3339Nano, *g.Rates.Until)
		if err != nil {
			t.Fatal(err)
		}
		return until.After(done) && shared > 0
	})
	rate := *g.edge(t, "topic.in", "stage.pass").Rate
	if counted := rate * g.Rates.Seconds; math.Abs(counted-10) > 0.05 {
		t.Errorf("the rate into pass is %v/s over %vs: %v messages, want the 10 it read", rate, g.Rates.Seconds, counted)
	}
}

// TestRedisStreamSourceLag: the entries of a redis_stream source's stream that the source has not
// read are its lag, in the snapshot, /api/graph and the metrics. Another process holds the source,
// so this one reads nothing.
func TestRedisStreamSourceLag(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	stream := "external:" + t.Name() + ":" + itoa(prefixes.Add(1))
	plan := buildSource(t, `
pipeline "ext" {}
variable "stream" {}
topic "in" {}
source "feed" {
  kind   = "redis_stream"
  stream = var.stream
  output = topic.in
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`, "stream="+stream)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	if _, ok, err := c.AcquireLease(ctx, keys.StreamLease(stream, "feed"), "another-process", time.Hour); err != nil || !ok {
		t.Fatalf("lease: %v %v", ok, err)
	}
	for i := 0; i < 4; i++ {
		if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"i", i}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()
	s := startService(t, c, plan, runtime.Options{MeterProvider: mp})
	waitFor(t, "the source's lag of 4", func() bool {
		for _, p := range s.rt.Snapshot().Partitions {
			if p.Node == "feed" {
				return p.Lag == 4 && p.Length == 4 && p.Stream == stream && p.Topic == ""
			}
		}
		return false
	})

	g, _ := getGraph(t, web.NewHandler(s.rt, nil))
	var found bool
	for _, n := range g.Nodes {
		if n.ID == "source.feed" {
			found = n.Stream != nil && n.Stream.Stream == stream && n.Stream.Lag == 4 && n.Stream.Length == 4
		}
	}
	if !found {
		t.Errorf("/api/graph does not show the source's lag: %+v", g.node(t, "source.feed"))
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	lag := int64(-1)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "flowrun.partition.lag" {
				for _, dp := range g.DataPoints {
					if name, _ := dp.Attributes.Value("messaging.destination.name"); node(dp.Attributes) == "feed" && name.AsString() == stream {
						lag = dp.Value
					}
				}
			}
		}
	}
	if lag != 4 {
		t.Errorf("flowrun.partition.lag of the source is %d, want 4", lag)
	}
}

// TestPollKeepsWhatItCanRead: a key that cannot be read (a dead-letter stream that someone replaced
// by a string while the pipeline runs; at start, it would end the run) spoils only its own number,
// which keeps its last value; the partitions and the other dead-letter streams are still polled,
// and the error is reported.
func TestPollKeepsWhatItCanRead(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	plan := buildTestdata(t, "web.hcl")
	s := startService(t, c, plan, runtime.Options{})
	if err := c.Universal().Set(ctx, redis.Keys{Prefix: plan.KeyPrefix}.DeadLetter("out"), "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Written after the key went bad: a poll that threw everything away on an error would not see them.
	publishRun(t, c, plan, "", 0, 10)
	waitFor(t, "a poll of every partition, with an error", func() bool {
		snap := s.rt.Snapshot()
		_, pass := snap.DeadLetters["pass"]
		var length int64
		for _, p := range snap.Partitions {
			if p.Topic == "in" {
				length += p.Length
			}
		}
		return len(snap.Partitions) == 4 && length == 10 && pass && snap.PollErr != nil &&
			strings.Contains(snap.PollErr.Error(), "WRONGTYPE")
	})
	if s.rt.Ready() == nil {
		t.Errorf("ready while a stream cannot be read")
	}
}
