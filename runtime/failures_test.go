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

// attemptsSeen counts the attempts of test.twice per message, by test and seq.
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
	})
	// test.never fails every attempt.
	stages.Register("test.never", func(context.Context, stages.Message) ([]stages.Message, error) {
		return nil, errors.New("the downstream service is down")
	})
}

const retryPipeline = `
pipeline "retries" {}
variable "out" {}
variable "in_place" { default = false }
variable "run" {}
retry "three" {
  max_attempts = 3
  backoff      = "constant"
  initial      = "30ms"
}
topic "in" {
  partitions = 2
  key        = msg.key
}
source "gen" {
  kind     = "generate"
  count    = 60
  output   = topic.in
  template = { key = "k${index % 4}", seq = index, run = var.run }
}
stage "twice" {
  kind           = "go"
  func           = "test.twice"
  input          = topic.in
  retry          = retry.three
  retry_in_place = var.in_place
}
sink "out" {
  kind  = "file"
  input = stage.twice
  path  = var.out
}
`

// TestDurableRetriesLetLaterMessagesPass retries failed messages through the retry set in Redis:
// they all arrive on their third attempt, and later messages of their keys do not wait for them.
func TestDurableRetriesLetLaterMessagesPass(t *testing.T) {
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, retryPipeline, "out="+out, "run="+t.Name())
			j := runJob(t, b.open(t), plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
			got := jsonLines(t, readFile(t, out))
			if len(got) != 60 {
				t.Fatalf("%d messages arrived, want 60", len(got))
			}
			if n := j.node(t, "twice"); n.Failed != 24 || n.Retried != 24 || n.DeadLettered != 0 {
				t.Errorf("twice: %+v, want 24 failed and retried attempts (12 messages, twice each)", n)
			}
			if strings.Count(j.log, "retry scheduled") != 24 {
				t.Errorf("%d retries went through the retry set, want 24", strings.Count(j.log, "retry scheduled"))
			}
			// Message 0 waited in Redis: the later messages of its key went first.
			if first := got[0]["seq"].(float64); first == 0 {
				passed := false
				for _, m := range got {
					if m["key"] == "k0" && m["seq"].(float64) > 0 {
						passed = true
					}
					if m["seq"].(float64) == 0 {
						break
					}
				}
				if !passed {
					t.Errorf("no later message of key k0 arrived before the retried message 0")
				}
			}
		})
	}
}

// TestRetriesInPlaceKeepOrder retries in place: every key keeps its order, the retried messages
// included.
func TestRetriesInPlaceKeepOrder(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	plan := buildSource(t, retryPipeline, "out="+out, "in_place=true", "run="+t.Name())
	j := runJob(t, server.open(t), plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
	got := jsonLines(t, readFile(t, out))
	if len(got) != 60 {
		t.Fatalf("%d messages arrived, want 60", len(got))
	}
	keyOrderKept(t, "output", got, "key", "seq")
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
	if n := j.node(t, "never"); n.Failed != 1 || n.DeadLettered != 1 {
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
	src := `
pipeline "http" {}
variable "url" {}
retry "five" {
  max_attempts = 5
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
		got := map[float64]bool{}
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
			got[m["seq"].(float64)] = true
			mu.Unlock()
		}))
		defer svc.Close()
		plan := buildSource(t, src, "url="+svc.URL)
		j := runJob(t, server.open(t), plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
		if len(got) != 20 {
			t.Errorf("%d messages delivered, want 20", len(got))
		}
		if n := j.node(t, "hook"); n.Failed != 7 || n.DeadLettered != 0 {
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
		if n := j.node(t, "hook"); n.Failed != 100 || n.DeadLettered != 20 {
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
	if n := len(jsonLines(t, readFile(t, out))); n != 60 {
		t.Fatalf("%d messages, want 60\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), "source lease expired and was taken again") {
		t.Errorf("the lease was not taken again:\n%s", log.String())
	}
}
