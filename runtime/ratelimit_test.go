package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/flowtest"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// stampClock is the virtual clock of TestRateLimitDelaysToTheRate, which ratelimit.stamp reads.
var stampClock atomic.Pointer[flowtest.Clock]

// ratelimit.passed and ratelimit.arrived add to each message the time they see it, on the test's
// virtual clock (microseconds since flowtest.Epoch), as passed_us or arrived_us. They keep keys:
// ratelimit.passed runs fused after the rate limit, as the message passes it; ratelimit.arrived in
// a hop of its own, as the message arrives downstream, once the limit's batch is committed.
func init() {
	for _, field := range []string{"passed", "arrived"} {
		stages.Register("ratelimit."+field, func(_ context.Context, m stages.Message) ([]stages.Message, error) {
			m.Value[field+"_us"] = stampClock.Load().Now().Sub(flowtest.Epoch).Microseconds()
			return []stages.Message{m}, nil
		}, stages.KeepsKey())
	}
}

// TestRateLimitDelaysToTheRate runs a rate_limit stage of 100 messages a second per tenant, with
// bursts of 5, on a redis-server and a virtual clock that moves on only when the run is idle: the
// tenant "hot" sends 60 messages at once, "cold" (in the other partition) 5. Every message arrives
// once, in its tenant's order; hot's pass 5 at once and then one every 10ms of the clock, none
// sooner and none later, and arrive at the next stage no faster; cold's all go at once, not held
// behind hot's; the stage counts the waits as its delayed time, and no failure.
func TestRateLimitDelaysToTheRate(t *testing.T) {
	const hot, cold, burst, interval = 60, 5, 5, 10 * time.Millisecond
	clock := flowtest.NewClock(flowtest.Epoch)
	stampClock.Store(clock)
	c := openURLs(t, redistest.Shared(t).URL()).WithClockedReads()
	out := fmt.Sprintf("ratelimit-%d:out", prefixes.Add(1))
	plan := buildSource(t, `
pipeline "rate" {}
topic "calls" {
  partitions = 2
  key        = msg.tenant
}
stage "limit" {
  kind  = "rate_limit"
  input = topic.calls
  key   = msg.tenant
  rate  = 100
  per   = "1s"
  burst = `+fmt.Sprint(burst)+`
}
stage "passed" {
  kind  = "go"
  func  = "ratelimit.passed"
  input = stage.limit
}
stage "arrived" {
  kind  = "go"
  func  = "ratelimit.arrived"
  input = stage.passed
  fuse  = false
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.arrived
  stream = "`+out+`"
}
`)
	if p0, p1 := redis.Partition("hot", 2), redis.Partition("cold", 2); p0 == p1 {
		t.Fatalf("hot and cold share partition %d", p0)
	}
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := range hot {
		publish(t, pub, fmt.Sprintf(`{"tenant":"hot","i":%d}`, i))
		if i < cold {
			publish(t, pub, fmt.Sprintf(`{"tenant":"cold","i":%d}`, i))
		}
	}
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	activity := &runtime.Activity{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go driveWhenIdle(ctx, clock, activity, c)
	j := runJob(t, c, plan, runtime.Options{Clock: clock, Activity: activity})

	passed, arrived := map[string][]int64{}, map[string][]int64{}
	for _, r := range readAll(t, c, out) {
		var v struct {
			Tenant    string
			I         int
			PassedUS  int64 `json:"passed_us"`
			ArrivedUS int64 `json:"arrived_us"`
		}
		if err := json.Unmarshal(r.Payload, &v); err != nil {
			t.Fatal(err)
		}
		if v.I != len(passed[v.Tenant]) {
			t.Fatalf("%s's message %d arrived as its %d-th: lost, repeated or out of order", v.Tenant, v.I, len(passed[v.Tenant]))
		}
		passed[v.Tenant] = append(passed[v.Tenant], v.PassedUS)
		arrived[v.Tenant] = append(arrived[v.Tenant], v.ArrivedUS)
	}
	if len(passed["hot"]) != hot || len(passed["cold"]) != cold {
		t.Fatalf("%d of hot's and %d of cold's messages arrived, want %d and %d", len(passed["hot"]), len(passed["cold"]), hot, cold)
	}
	start := passed["hot"][0]
	us := interval.Microseconds()
	for k, at := range passed["hot"] {
		if earliest := start + int64(max(k-burst+1, 0))*us; at < earliest {
			t.Errorf("hot's message %d passed at %dus, before its turn at %dus", k, at-start, earliest-start)
		}
	}
	if last, want := passed["hot"][hot-1]-start, int64(hot-burst)*us; last < want || last >= want+us {
		t.Errorf("hot's last message passed %dus after its first, want %dus: the limit's pace", last, want)
	}
	// Downstream, hot's messages arrive no faster than the limit either: never more than a burst
	// within the time the limit allows them (the stage reads at most a burst at a time, and passes
	// a batch on when its last message's turn has come).
	for i, a := range arrived["hot"] {
		for j := i + 1; j < hot; j++ {
			if gap, least := arrived["hot"][j]-a, int64(j-i-burst+1)*us; gap < least {
				t.Fatalf("hot's messages %d to %d arrived within %dus, the limit allows no less than %dus", i, j, gap, least)
			}
		}
	}
	for k, at := range passed["cold"] {
		if at >= start+us {
			t.Errorf("cold's message %d passed at %dus, held behind hot's (from %dus)", k, at-start, us)
		}
	}
	n := j.node(t, "limit")
	if n.In != hot+cold || n.Out != hot+cold || n.DeadLettered != 0 || n.FailedAttempts != 0 || n.Retries != 0 {
		t.Errorf("limit: %+v, want every message in and out, no failure", n)
	}
	if want := time.Duration(hot-burst) * interval; n.Delayed < want || n.Delayed >= want+interval || n.Delaying != 0 {
		t.Errorf("limit delayed its messages %s in all (%d waiting), want %s", n.Delayed, n.Delaying, want)
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	if n, err := c.Universal().Exists(context.Background(), keys.RateLimit("limit", "hot"), keys.RateLimit("limit", "cold")).Result(); err != nil || n != 2 {
		t.Errorf("%d rate limit keys in Redis (%v), want hot's and cold's", n, err)
	}
}

func publish(t *testing.T, pub *runtime.Publisher, payload string) {
	t.Helper()
	if err := pub.Publish(context.Background(), "calls", stages.NewMessage("", []byte(payload), nil)); err != nil {
		t.Fatal(err)
	}
}

// readAll reads a whole stream, in order.
func readAll(t *testing.T, c *redis.Client, stream string) []redis.Record {
	t.Helper()
	var all []redis.Record
	after := "0"
	for {
		recs, err := c.Read(context.Background(), stream, after, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return all
		}
		all = append(all, recs...)
		after = recs[len(recs)-1].ID
	}
}

// driveWhenIdle moves a virtual clock to its next timer whenever the run is idle, as flowtest's
// harness does: no goroutine at work, no command in flight, no timer fired and unread, and no timer
// armed or stopped, for a few looks in a row. So a run takes no virtual time to do what is due.
func driveWhenIdle(ctx context.Context, clock *flowtest.Clock, activity *runtime.Activity, c *redis.Client) {
	var last uint64
	still := 0
	for ctx.Err() == nil {
		goruntime.Gosched()
		time.Sleep(10 * time.Microsecond)
		changes := clock.Changes()
		busy := activity.Working() > 0 || c.InFlight() > 0 || clock.Undelivered(50*time.Millisecond)
		if busy || changes != last {
			last, still = changes, 0
			continue
		}
		if still++; still < 4 {
			continue
		}
		if next, ok := clock.Next(); ok {
			clock.AdvanceTo(next)
		}
		still = 0
	}
}
