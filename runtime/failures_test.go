package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// attemptsSeen counts the attempts of test.twice per message, by run and seq: each run of a test
// (also with -count) has a run of its own.
var attemptsSeen sync.Map

func init() {
	// test.twice fails the first two attempts at every message whose seq is divisible by 5.
	stages.Register("test.twice", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		seq, _ := m.Value["seq"].(json.Number)
		if n, _ := seq.Int64(); n%5 != 0 {
			return []stages.Message{m}, nil
		}
		key := fmt.Sprint(m.Value["run"], "/", seq)
		v, _ := attemptsSeen.LoadOrStore(key, new(atomic.Int64))
		if v.(*atomic.Int64).Add(1) <= 2 {
			return nil, errors.New("not yet")
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
	// test.never fails every attempt.
	stages.Register("test.never", func(context.Context, stages.Message) ([]stages.Message, error) {
		return nil, errors.New("the downstream service is down")
	}, stages.KeepsKey())
}

// TestDurableRetriesLetLaterMessagesPass retries failed messages through the retry set in Redis:
// they all arrive, once each, on their third attempt, and later messages of their keys do not wait
// for them. The messages are in the topic before the run starts, so that each partition's first
// read has all of them: the failed ones move to the retry set in the commit that writes the later
// ones, which therefore arrive first, whatever the machine's speed.
func TestDurableRetriesLetLaterMessagesPass(t *testing.T) {
	t.Parallel()
	const n = 60
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			run := t.Name() + itoa(prefixes.Add(1)) // test.twice fails each run's messages afresh
			// The pipeline without its source (retries/gen.hcl): the test publishes the messages.
			plan := buildTestdata(t, "retries/retries.hcl", "out="+out, "run="+run)
			pub, err := runtime.NewPublisher(c, plan)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				m := fmt.Sprintf(`{"key":"k%d","seq":%d,"run":%q}`, i%4, i, run)
				if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(m), nil)); err != nil {
					t.Fatal(err)
				}
			}
			if err := pub.Close(ctx); err != nil {
				t.Fatal(err)
			}
			j := runJob(t, c, plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
			got := jsonLines(t, readFile(t, out))
			seqs := map[int]int{}
			for _, m := range got {
				seqs[int(m["seq"].(float64))]++
			}
			if dups := tally(t, seqs, n); dups > 0 {
				t.Errorf("%d messages arrived twice", dups)
			}
			if n := j.node(t, "twice"); n.FailedAttempts != 24 || n.Retries != 24 || n.DeadLettered != 0 {
				t.Errorf("twice: %+v, want 24 failed and retried attempts (12 messages, twice each)", n)
			}
			if strings.Count(j.log, "retry scheduled") != 24 {
				t.Errorf("%d retries went through the retry set, want 24", strings.Count(j.log, "retry scheduled"))
			}
			// Each retried message (seq divisible by 5) waited in Redis: every later message of
			// its key that did not fail arrived before it.
			position := map[int]int{}
			for i, m := range got {
				position[int(m["seq"].(float64))] = i
			}
			for s := 0; s < n; s += 5 {
				for later := s + 4; later < n; later += 4 { // the same key: seq mod 4
					if later%5 != 0 && position[later] > position[s] {
						t.Errorf("message %d of key k%d arrived after the retried message %d: it waited for it", later, s%4, s)
					}
				}
			}
		})
	}
}

// TestRetriesInPlaceKeepOrder retries in place: every key keeps its order, the retried messages
// included.
func TestRetriesInPlaceKeepOrder(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	run := t.Name() + itoa(prefixes.Add(1)) // test.twice fails each run's messages afresh
	plan := buildTestdata(t, "retries", "out="+out, "in_place=true", "run="+run)
	j := runJob(t, server.open(t), plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
	got := jsonLines(t, readFile(t, out))
	seqs := map[int]int{}
	for _, m := range got {
		seqs[int(m["seq"].(float64))]++
	}
	if dups := tally(t, seqs, 60); dups > 0 {
		t.Errorf("%d messages arrived twice", dups)
	}
	keyOrderKept(t, "output", got, "key", "seq")
	if n := j.node(t, "twice"); n.FailedAttempts != 24 || n.Retries != 24 || n.DeadLettered != 0 {
		t.Errorf("twice: %+v, want 24 failed and retried attempts (12 messages, twice each)", n)
	}
	if strings.Contains(j.log, "retry scheduled") {
		t.Error("a retry went through the retry set although retry_in_place is true")
	}
}

// TestAttemptsSurviveARestart puts a message in a stage's retry set as a previous process would
// have left it, after two attempts: the next process makes the third and last attempt and
// dead-letters it with all three counted.
func TestAttemptsSurviveARestart(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	plan := buildSource(t, `
pipeline "restart" {}
retry "three" {
  max_attempts = 3
  initial      = "10s"
}
topic "in" {}
stage "never" {
  kind  = "go"
  func  = "test.never"
  input = topic.in
  retry = retry.three
}
sink "out" {
  kind  = "stdout"
  input = stage.never
}
`)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	first := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	if err := c.AddRetries(ctx, keys.Retry("in", 0, "never"), redis.Retry{
		Entry:    redis.Entry{ID: "1-0", Key: "k", Payload: []byte(`{"order":7}`)},
		Attempts: 2, FirstFailure: first, LastError: "down", Due: time.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	j := runJob(t, c, plan, runtime.Options{})
	dead, err := c.Universal().XRange(ctx, keys.DeadLetter("never"), "-", "+").Result()
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters: %v, %v", dead, err)
	}
	env := jsonObject(t, dead[0].Values["payload"].(string))
	if env["attempts"] != 3.0 || env["id"] != "1-0" || !strings.Contains(env["error"].(string), "down") ||
		env["first_failed_at"] != first.UTC().Format(time.RFC3339Nano) && !sameInstant(t, env["first_failed_at"].(string), first) {
		t.Errorf("dead letter %v", env)
	}
	if n := j.node(t, "never"); n.FailedAttempts != 1 || n.DeadLettered != 1 {
		t.Errorf("never: %+v, want one attempt, dead-lettered", n)
	}
}

func sameInstant(t *testing.T, s string, want time.Time) bool {
	got, err := time.Parse(time.RFC3339Nano, s)
	return err == nil && got.Equal(want)
}

// TestPoisonMessageIsDeadLettered gives an entry the delivery count of a message that crashed every
// process that took it: the next owner dead-letters it instead of delivering it again.
func TestPoisonMessageIsDeadLettered(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	plan := buildSource(t, `
pipeline "poison" {}
variable "out" {}
topic "in" {}
stage "pass" {
  kind  = "filter"
  input = topic.in
  where = true
}
sink "out" {
  kind  = "file"
  input = stage.pass
  path  = var.out
}
`, "out="+out)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	stream := keys.Stream("in", 0)
	rdb := c.Universal()
	if err := c.EnsureGroup(ctx, stream, "pass"); err != nil {
		t.Fatal(err)
	}
	poison, err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"payload", `{"n":"poison"}`}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"payload", `{"n":"fine"}`}}).Err(); err != nil {
		t.Fatal(err)
	}
	// Six dead consumers took the first entry in turn (a read, then five claims).
	if err := rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: "pass", Consumer: "dead-0", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		if err := rdb.XClaim(ctx, &goredis.XClaimArgs{Stream: stream, Group: "pass", Consumer: fmt.Sprintf("dead-%d", i), MinIdle: 0, Messages: []string{poison}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	runJob(t, c, plan, runtime.Options{})
	sameMessages(t, "passed", jsonLines(t, readFile(t, out)), []map[string]any{{"n": "fine"}})
	dead, err := rdb.XRange(ctx, keys.DeadLetter("pass"), "-", "+").Result()
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters: %v, %v", dead, err)
	}
	env := jsonObject(t, dead[0].Values["payload"].(string))
	if env["id"] != poison || !strings.Contains(env["error"].(string), "poison message") {
		t.Errorf("dead letter %v", env)
	}
}

// TestHTTPSinkRetries sends to a service that fails a while, then to one that always fails.
func TestHTTPSinkRetries(t *testing.T) {
	t.Parallel()
	src := `
pipeline "http" {}
variable "url" {}
variable "attempts" { default = 5 }
retry "five" {
  max_attempts = var.attempts
  backoff      = "exponential"
  initial      = "5ms"
  max          = "40ms"
}
topic "in" {
  partitions = 2
  key        = msg.key
}
source "gen" {
  kind     = "generate"
  count    = 20
  output   = topic.in
  template = { key = "k${index % 3}", seq = index }
}
sink "hook" {
  kind  = "http"
  input = topic.in
  url   = var.url
  retry = retry.five
}
`
	t.Run("transient", func(t *testing.T) {
		var calls atomic.Int64
		var mu sync.Mutex
		got := map[int]int{}
		svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The first 7 calls fail with statuses worth retrying.
			switch n := calls.Add(1); {
			case n <= 3:
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return
			case n <= 5:
				http.Error(w, "slow down", http.StatusTooManyRequests)
				return
			case n <= 7:
				http.Error(w, "timeout", http.StatusRequestTimeout)
				return
			}
			var m map[string]any
			_ = json.NewDecoder(r.Body).Decode(&m)
			mu.Lock()
			got[int(m["seq"].(float64))]++
			mu.Unlock()
		}))
		defer svc.Close()
		// Fewer attempts than the service's failures: the paused sink's probes go to its waiting
		// messages in turn, so the failures spread and none runs out of its 5 attempts.
		plan := buildSource(t, src, "url="+svc.URL)
		j := runJob(t, server.open(t), plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
		mu.Lock()
		defer mu.Unlock()
		// Each of the 20 delivered once: a failed attempt's request is not counted, and a
		// delivery that succeeded is not repeated.
		if dups := tally(t, got, 20); dups > 0 {
			t.Errorf("%d messages delivered twice", dups)
		}
		if n := j.node(t, "hook"); n.FailedAttempts != 7 || n.DeadLettered != 0 {
			t.Errorf("hook: %+v, want 7 failed attempts and no dead letter", n)
		}
	})
	t.Run("permanent", func(t *testing.T) {
		svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "broken", http.StatusInternalServerError)
		}))
		defer svc.Close()
		c := server.open(t)
		plan := buildSource(t, src, "url="+svc.URL)
		j := runJob(t, c, plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
		if n := j.node(t, "hook"); n.FailedAttempts != 100 || n.DeadLettered != 20 {
			t.Errorf("hook: %+v, want 5 failed attempts at each of 20 messages", n)
		}
		dead, err := c.Universal().XRange(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.DeadLetter("hook"), "-", "+").Result()
		if err != nil || len(dead) != 20 {
			t.Fatalf("%d dead letters, %v", len(dead), err)
		}
		for _, d := range dead {
			env := jsonObject(t, d.Values["payload"].(string))
			if env["attempts"] != 5.0 || !strings.Contains(env["error"].(string), "500 Internal Server Error: broken") {
				t.Errorf("dead letter %v", env)
			}
		}
	})
	t.Run("rejected", func(t *testing.T) {
		var calls atomic.Int64
		svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.Error(w, "bad order", http.StatusUnprocessableEntity)
		}))
		defer svc.Close()
		plan := buildSource(t, src, "url="+svc.URL)
		j := runJob(t, server.open(t), plan, runtime.Options{})
		if calls.Load() != 20 {
			t.Errorf("%d calls, want one per message: a 422 is not retried", calls.Load())
		}
		if n := j.node(t, "hook"); n.DeadLettered != 20 {
			t.Errorf("hook: %+v", n)
		}
	})
}

// TestEntryTrimmedWhilePendingIsRecorded trims an entry that a dead consumer had read but not
// acknowledged: when its partition is taken over, the entry is gone, and the dead-letter stream says
// so with its ID.
func TestEntryTrimmedWhilePendingIsRecorded(t *testing.T) {
	ctx := context.Background()
	c := server.open(t) // miniredis does not report entries deleted while pending
	plan := buildSource(t, `
pipeline "trimmed" {}
topic "in" {}
stage "pass" {
  kind  = "filter"
  input = topic.in
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.pass
}
`)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	stream := keys.Stream("in", 0)
	rdb := c.Universal()
	if err := c.EnsureGroup(ctx, stream, "pass"); err != nil {
		t.Fatal(err)
	}
	lost, err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"payload", `{"n":1}`}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: "pass", Consumer: "dead", Streams: []string{stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XDel(ctx, stream, lost).Err(); err != nil {
		t.Fatal(err)
	}
	j := runJob(t, c, plan, runtime.Options{})
	dead, err := rdb.XRange(ctx, keys.DeadLetter("pass"), "-", "+").Result()
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters: %v, %v", dead, err)
	}
	env := jsonObject(t, dead[0].Values["payload"].(string))
	if env["id"] != lost || !strings.Contains(env["error"].(string), "deleted from the stream") {
		t.Errorf("dead letter %v", env)
	}
	if j.summary.DeadLettered() != 1 {
		t.Errorf("summary counts %d dead letters", j.summary.DeadLettered())
	}
}

// TestExpiredSourceLeaseIsTakenAgain lets a producing source's lease expire while it runs, as when
// the process stalls past the TTL: nobody else took it, so the process takes it again and the source
// goes on to its end.
func TestExpiredSourceLeaseIsTakenAgain(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	plan := buildSource(t, `
pipeline "lease" {}
variable "out" {}
topic "in" {}
source "gen" {
  kind     = "generate"
  count    = 60
  rate     = 200
  output   = topic.in
  template = { n = index }
}
sink "out" {
  kind  = "file"
  input = topic.in
  path  = var.out
}
`, "out="+out)
	var log syncBuffer
	rt, err := runtime.New(plan, runtime.Options{Redis: c, UntilDrained: true, LeaseTTL: time.Second, Logger: newLogger(&log)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := rt.Run(ctx); done <- err }()
	waitFor(t, "the source to be under way", func() bool {
		s := rt.Snapshot()
		return len(s.Sources) == 1 && s.Sources[0].Produced >= 10
	})
	if err := c.Universal().Del(ctx, redis.Keys{Prefix: plan.KeyPrefix}.SourceLease("gen")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	// The 60, once each: nobody else ran the source meanwhile, and it did not start again.
	if dups := tally(t, countBy(t, jsonLines(t, readFile(t, out)), "n"), 60); dups > 0 {
		t.Errorf("%d messages written twice\n%s", dups, log.String())
	}
	if !strings.Contains(log.String(), "source lease expired and was taken again") {
		t.Errorf("the lease was not taken again:\n%s", log.String())
	}
}
