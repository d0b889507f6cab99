package cmd

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime/admin"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// resetPipeline reads INPUT with a file source (a position), dead-letters the orders whose amount
// is not a number (dead letters), sums the rest per customer and minute (state, timers) and writes
// the sums to OUTPUT.
const resetPipeline = `
retry "once" {
  max_attempts = 1
}

source "orders" {
  kind   = "file"
  path   = "INPUT"
  output = topic.orders
}

topic "orders" {
  partitions = 2
  key        = msg.customer
}

stage "priced" {
  kind  = "map"
  input = topic.orders
  retry = retry.once
  set = {
    amount = tonumber(msg.amount)
  }
}

stage "per_minute" {
  kind       = "aggregate"
  input      = stage.priced
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    orders  = count()
    revenue = sum(msg.amount)
  }
}

sink "totals" {
  kind  = "file"
  input = stage.per_minute
  path  = "OUTPUT"
  mode  = "truncate"
}
`

const resetInput = `{"customer":"alice","amount":"12.5","at":"2026-03-01T09:00:05Z"}
{"customer":"bob","amount":"40","at":"2026-03-01T09:00:12Z"}
{"customer":"alice","amount":"lots","at":"2026-03-01T09:00:30Z"}
{"customer":"alice","amount":"7.5","at":"2026-03-01T09:00:40Z"}
{"customer":"bob","amount":"10","at":"2026-03-01T09:01:20Z"}
{"customer":"alice","amount":"20","at":"2026-03-01T09:01:30Z"}
`

// resetJob writes resetPipeline with its input, and returns its path, key prefix and output file.
func resetJob(t *testing.T) (path, prefix, output string) {
	t.Helper()
	dir := t.TempDir()
	input, output := filepath.Join(dir, "orders.jsonl"), filepath.Join(dir, "totals.jsonl")
	if err := os.WriteFile(input, []byte(resetInput), 0o644); err != nil {
		t.Fatal(err)
	}
	path, prefix = testPipeline(t, strings.NewReplacer("INPUT", input, "OUTPUT", output).Replace(resetPipeline))
	return path, prefix, output
}

// keysUnder lists every key under the prefix, on every master of a cluster.
func keysUnder(t *testing.T, urls []string, prefix string) []string {
	t.Helper()
	conn, err := admin.Connect(testContext(t), admin.ConnectOptions{URLs: urls})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	keys, err := conn.Client().KeysUnder(testContext(t), prefix)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// After a job ran, reset --yes leaves only the topics' streams, and the job run again writes what
// it wrote the first time: without the reset it would resume after the file's last line and write
// nothing. reset --topics --yes then leaves no key at all.
func TestResetRerunsFromScratch(t *testing.T) {
	for name, urls := range map[string][]string{
		"server":  {redistest.Shared(t).URL()},
		"cluster": redistest.SharedCluster(t, 3).URLs(),
	} {
		t.Run(name, func(t *testing.T) {
			path, prefix, output := resetJob(t)
			redisURL := strings.Join(urls, ",")
			job := func() string {
				t.Helper()
				if code, _, errOut := run(t, "run", "--until-drained", "--redis", redisURL, path); code != ExitDeadLettered {
					t.Fatalf("run: exit %d, want %d (one dead letter)\n%s", code, ExitDeadLettered, errOut)
				}
				b, err := os.ReadFile(output)
				if err != nil {
					t.Fatal(err)
				}
				lines := strings.SplitAfter(string(b), "\n")
				sort.Strings(lines) // the partitions' sums come in any order
				return strings.Join(lines, "")
			}

			first := job()
			if strings.Count(first, "\n") != 4 {
				t.Fatalf("first run wrote %q, want 4 sums", first)
			}
			before := strings.Join(keysUnder(t, urls, prefix), "\n")
			for _, want := range []string{":position", ":state:per_minute", ":state:per_minute:partitions", ":state:per_minute:fingerprint", ":dlq:{priced}", ":watermarks", ":lease:priced:fence"} {
				if !strings.Contains(before, want) {
					t.Fatalf("no key with %q after the run, so the test proves nothing about it:\n%s", want, before)
				}
			}

			code, out, errOut := run(t, "reset", "--yes", "--redis", redisURL, path)
			if code != ExitOK || !strings.Contains(out, "consumer group") || !strings.Contains(out, "source position") || !strings.Contains(out, "dead letters") {
				t.Fatalf("reset: exit %d\n%s%s", code, out, errOut)
			}
			stream := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `:\{[a-z_.]+:[0-9]+\}$`)
			for _, k := range keysUnder(t, urls, prefix) {
				if !stream.MatchString(k) {
					t.Errorf("reset left %s", k)
				}
			}

			if second := job(); second != first {
				t.Fatalf("the run after reset wrote\n%s\nthe first run wrote\n%s", second, first)
			}

			if code, out, errOut := run(t, "reset", "--yes", "--topics", "--redis", redisURL, path); code != ExitOK || !strings.Contains(out, "topic partition") {
				t.Fatalf("reset --topics: exit %d\n%s%s", code, out, errOut)
			}
			if left := keysUnder(t, urls, prefix); len(left) != 0 {
				t.Fatalf("reset --topics left %v", left)
			}
		})
	}
}

// reset refuses while a service runs the pipeline, naming its process, and deletes nothing; once
// the service stopped it goes on. Without --yes and a terminal it refuses too.
func TestResetRefusesWhileRunning(t *testing.T) {
	for name, urls := range map[string][]string{
		"server":  {redistest.Shared(t).URL()},
		"cluster": redistest.SharedCluster(t, 3).URLs(),
	} {
		t.Run(name, func(t *testing.T) {
			path, prefix := testPipeline(t, `
source "gen" {
  kind   = "generate"
  count  = 3
  output = topic.t
  template = {
    n = index
  }
}
topic "t" { partitions = 2 }
sink "out" {
  kind  = "stdout"
  input = topic.t
}
`)
			redisURL := strings.Join(urls, ",")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := newLineWriter()
			done := make(chan int, 1)
			go func() {
				done <- Execute(ctx, []string{"run", path, "--redis", redisURL}, IO{In: strings.NewReader(""), Out: out, Err: io.Discard})
			}()
			for range 3 {
				out.next(t) // the sink wrote a message: the service holds its partitions' leases
			}
			before := keysUnder(t, urls, prefix)
			code, stdout, errOut := run(t, "reset", "--yes", "--redis", redisURL, path)
			if code != ExitError || !strings.Contains(errOut, "is running (process ") || !strings.Contains(stdout, "running: process ") {
				t.Fatalf("reset of a running pipeline: exit %d\n%s%s", code, stdout, errOut)
			}
			if after := keysUnder(t, urls, prefix); strings.Join(after, " ") != strings.Join(before, " ") {
				t.Fatalf("reset refused but keys changed:\nbefore %v\nafter  %v", before, after)
			}
			cancel()
			if code := <-done; code != ExitOK {
				t.Fatalf("service: exit %d", code)
			}
			if code, stdout, errOut := run(t, "reset", "--redis", redisURL, path); code != ExitInvalid || !strings.Contains(errOut, "pass --yes") {
				t.Fatalf("reset without --yes or a terminal: exit %d\n%s%s", code, stdout, errOut)
			}
			if code, stdout, errOut := run(t, "reset", "--yes", "--redis", redisURL, path); code != ExitOK {
				t.Fatalf("reset after the service stopped: exit %d\n%s%s", code, stdout, errOut)
			}
			if left := keysUnder(t, urls, prefix); len(left) != 2 {
				t.Fatalf("after reset: %v; want the 2 partitions of topic t", left)
			}
		})
	}
}

// reset --stage deletes one node's keys and its consumer groups, and nothing of the other nodes;
// a node the pipeline does not have, or --topics with --stage, is refused before Redis is asked.
func TestResetOneStage(t *testing.T) {
	srv := redistest.Shared(t)
	path, prefix, _ := resetJob(t)
	if code, _, errOut := run(t, "run", "--until-drained", "--redis", srv.URL(), path); code != ExitDeadLettered {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	ofStage := func(k string) bool {
		return strings.HasSuffix(k, ":per_minute") || strings.Contains(k, ":per_minute:") || strings.HasSuffix(k, "{per_minute}")
	}
	before := keysUnder(t, []string{srv.URL()}, prefix)
	code, out, errOut := run(t, "reset", "--stage", "per_minute", "--yes", "--redis", srv.URL(), path)
	if code != ExitOK || !strings.Contains(out, "per_minute  consumer group, read from the first entry") || strings.Contains(out, "priced") {
		t.Fatalf("reset --stage: exit %d\n%s%s", code, out, errOut)
	}
	after := keysUnder(t, []string{srv.URL()}, prefix)
	var kept []string
	for _, k := range before {
		if !ofStage(k) {
			kept = append(kept, k)
		}
	}
	if strings.Join(after, "\n") != strings.Join(kept, "\n") {
		t.Fatalf("after reset --stage per_minute:\n%s\nwant the other nodes' keys:\n%s", strings.Join(after, "\n"), strings.Join(kept, "\n"))
	}
	if code, _, errOut := run(t, "reset", "--stage", "per_minutes", "--yes", "--redis", srv.URL(), path); code != ExitInvalid || !strings.Contains(errOut, `no source, stage or sink "per_minutes"`) {
		t.Fatalf("reset --stage of a node that is not there: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := run(t, "reset", "--stage", "priced", "--topics", "--yes", "--redis", srv.URL(), path); code != ExitInvalid || !strings.Contains(errOut, "--topics") {
		t.Fatalf("reset --stage --topics: exit %d\n%s", code, errOut)
	}
}

// A redis_stream source: reset refuses while a process holds the lease of its stream, then
// destroys its consumer group on the external stream, whose entries stay, and keeps the stream's
// key although it is under the prefix: flowrun does not write such a name.
func TestResetRedisStreamSource(t *testing.T) {
	for name, urls := range map[string][]string{
		"server":  {redistest.Shared(t).URL()},
		"cluster": redistest.SharedCluster(t, 3).URLs(),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			path, prefix := testPipeline(t, "")
			external := prefix + ":external{ext}"
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			src = append(src, []byte(`
topic "in" { partitions = 2 }
source "ext" {
  kind   = "redis_stream"
  stream = "`+external+`"
  group  = "ext-group"
  output = topic.in
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`)...)
			if err := os.WriteFile(path, src, 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := redis.Open(ctx, redis.Options{URLs: urls})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: external, Values: []string{"payload", `{"n":1}`}}).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.Universal().XGroupCreate(ctx, external, "ext-group", "0").Err(); err != nil {
				t.Fatal(err)
			}
			lease, ok, err := c.AcquireLease(ctx, redis.Keys{Prefix: prefix}.StreamLease(external, "ext"), "proc-b", time.Minute)
			if err != nil || !ok {
				t.Fatalf("lease: %v %v", ok, err)
			}
			redisURL := strings.Join(urls, ",")

			code, out, errOut := run(t, "reset", "--yes", "--redis", redisURL, path)
			if code != ExitError || !strings.Contains(errOut, "process proc-b holds "+lease.Key) {
				t.Fatalf("reset while proc-b reads the stream: exit %d\n%s%s", code, out, errOut)
			}
			if err := c.ReleaseLease(ctx, lease); err != nil {
				t.Fatal(err)
			}
			code, out, errOut = run(t, "reset", "--yes", "--redis", redisURL, path)
			if code != ExitOK || !strings.Contains(out, "source's consumer group") || !strings.Contains(out, "kept: 1 key under the prefix that flowrun does not write, such as "+external) {
				t.Fatalf("reset: exit %d\n%s%s", code, out, errOut)
			}
			groups, err := c.Universal().XInfoGroups(ctx, external).Result()
			if n, _ := c.Universal().XLen(ctx, external).Result(); err != nil || len(groups) != 0 || n != 1 {
				t.Fatalf("the external stream after reset: groups %v (%v), %d entries; want no group and its entry", groups, err, n)
			}
			if left := keysUnder(t, urls, prefix); len(left) != 1 || left[0] != external {
				t.Fatalf("reset left %v; want only %s", left, external)
			}
		})
	}
}
