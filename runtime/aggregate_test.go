package runtime_test

import (
	"context"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
	goredis "github.com/redis/go-redis/v9"
)

// An aggregate stage's job emits every window once, with exact counts and sums: those the watermark
// closed while the job ran, and, once the input is drained, those still open.
func TestAggregateJobEmitsEveryWindowOnce(t *testing.T) {
	t.Parallel()
	const n, customers = 300, 3
	src := `
pipeline "revenue" {}
variable "out" {}
topic "orders" {
  partitions = 3
  key        = msg.customer
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(n) + `
  output = topic.orders
  # An order every 10 seconds of event time, customers in turn, amounts 0 to n-1.
  template = {
    customer = "c${index % ` + strconv.Itoa(customers) + `}"
    amount   = index
    at       = index * 10000
  }
}
stage "per_minute" {
  kind       = "aggregate"
  group_by = msg.customer
  input      = topic.orders
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    orders  = count()
    revenue = sum(msg.amount)
    high    = max(msg.amount)
  }
}
sink "out" {
  kind  = "file"
  input = stage.per_minute
  path  = var.out
}
`
	want := map[aggregateWindow][2]int{} // orders, revenue
	for i := 0; i < n; i++ {
		w := aggregateWindow{"c" + strconv.Itoa(i%customers), time.UnixMilli(int64(i) * 10000 / 60000 * 60000).UTC().Format(time.RFC3339), ""}
		got := want[w]
		want[w] = [2]int{got[0] + 1, got[1] + i}
	}
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			runJob(t, c, buildSource(t, src, "out="+out), runtime.Options{})
			eachWindowOnce(t, jsonLines(t, readFile(t, out)), want, "orders", windowOf)
		})
	}
}

// aggregateWindow names a result of an aggregate: its key and its window's start, and its end where
// it tells windows apart (sessions).
type aggregateWindow struct{ key, start, end string }

func windowOf(m map[string]any) aggregateWindow {
	return aggregateWindow{m["key"].(string), m["window"].(map[string]any)["start"].(string), ""}
}

func sessionOf(m map[string]any) aggregateWindow {
	w := m["window"].(map[string]any)
	return aggregateWindow{m["key"].(string), w["start"].(string), w["end"].(string)}
}

// eachWindowOnce checks that an aggregate's results are the windows of want, each once, with its
// count (the field count) and revenue.
func eachWindowOnce(t *testing.T, got []map[string]any, want map[aggregateWindow][2]int, count string, id func(map[string]any) aggregateWindow) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d windows emitted, want %d", len(got), len(want))
	}
	seen := map[aggregateWindow]bool{}
	for _, m := range got {
		w := id(m)
		if seen[w] {
			t.Fatalf("window %v emitted twice", w)
		}
		seen[w] = true
		exp, ok := want[w]
		if !ok || int(m[count].(float64)) != exp[0] || int(m["revenue"].(float64)) != exp[1] {
			t.Errorf("window %v: %v, want %d %s and %d revenue", w, m, exp[0], count, exp[1])
		}
	}
}

// An aggregate of session windows emits every session once, with its exact count, sum and bounds
// ([first event, last event + gap)): those the watermark closed while the job ran, and, once the
// input is drained, those still open.
func TestAggregateJobEmitsEverySessionOnce(t *testing.T) {
	const n, users, gap = 240, 3, 2 * time.Minute
	src := `
pipeline "sessions" {}
variable "out" {}
topic "views" {
  partitions = 3
  key        = msg.user
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(n) + `
  output = topic.views
  # A view every 20 seconds, users in turn, so a minute apart for each user; every 30 views,
  # 10 minutes without any, which ends every user's session.
  template = {
    user   = "u${index % ` + strconv.Itoa(users) + `}"
    amount = index
    at     = index * 20000 + floor(index / 30) * 600000
  }
}
stage "sessions" {
  kind       = "aggregate"
  group_by = msg.user
  input      = topic.views
  event_time = msg.at
  window {
    type = "session"
    gap  = "2m"
  }
  aggregate = {
    views   = count()
    revenue = sum(msg.amount)
  }
}
sink "out" {
  kind  = "file"
  input = stage.sessions
  path  = var.out
}
`
	want := map[aggregateWindow][2]int{} // views, revenue
	last := map[string]int64{}
	first := map[string]int64{}
	tally := map[string][2]int{}
	flush := func(user string) {
		s := aggregateWindow{user, time.UnixMilli(first[user]).UTC().Format(time.RFC3339), time.UnixMilli(last[user] + gap.Milliseconds()).UTC().Format(time.RFC3339)}
		want[s] = tally[user]
	}
	for i := 0; i < n; i++ {
		user, at := "u"+strconv.Itoa(i%users), int64(i)*20000+int64(i/30)*600000
		if l, ok := last[user]; ok && at-l >= gap.Milliseconds() {
			flush(user)
			delete(tally, user)
		}
		if _, ok := tally[user]; !ok {
			first[user] = at
		}
		tally[user] = [2]int{tally[user][0] + 1, tally[user][1] + i}
		last[user] = at
	}
	for user := range tally {
		flush(user)
	}
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			runJob(t, c, buildSource(t, src, "out="+out), runtime.Options{})
			eachWindowOnce(t, jsonLines(t, readFile(t, out)), want, "views", sessionOf)
		})
	}
}

// max_keys on Redis: a dedupe and an aggregate stage that hold two keys per partition dead-letter
// the messages of every other key, saying why, while the two keys held go on; the aggregate's count
// goes back to nothing as its windows close at the end of the job, the dedupe's stays at its two
// remembered keys.
func TestMaxKeysDeadLettersTheMessagesOfNewKeys(t *testing.T) {
	src := `
pipeline "bounded" {}
topic "in" {
  partitions = 1
  key        = msg.id
}
source "gen" {
  kind     = "generate"
  count    = 20
  output   = topic.in
  template = {
    id = "k${index % 5}"
    at = index * 1000
  }
}
stage "once" {
  kind       = "dedupe"
  input      = topic.in
  key        = msg.id
  within     = "1h"
  event_time = msg.at
  max_keys   = 2
}
stage "counts" {
  kind       = "aggregate"
  group_by = msg.id
  input      = topic.in
  event_time = msg.at
  max_keys   = 2
  window {
    type = "tumbling"
    size = "1h"
  }
  aggregate = { n = count() }
}
sink "print_once" {
  kind  = "stdout"
  input = stage.once
}
sink "print_counts" {
  kind  = "stdout"
  input = stage.counts
}
`
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			plan := buildSource(t, src)
			j := runJob(t, c, plan, runtime.Options{})
			// k0 and k1 come four times each, k2, k3 and k4 too, and are refused each time.
			if n := j.node(t, "once"); n.Out != 2 || n.Duplicates != 6 || n.DeadLettered != 12 {
				t.Errorf("once: %+v, want 2 out, 6 duplicates, 12 dead-lettered", n)
			}
			if n := j.node(t, "counts"); n.Written != 2 || n.Absorbed != 8 || n.DeadLettered != 12 {
				t.Errorf("counts: %+v, want 8 absorbed into 2 windows written, 12 dead-lettered", n)
			}
			for _, want := range []string{`"key":"k0","n":4`, `"key":"k1","n":4`} {
				if !strings.Contains(j.stdout, want) {
					t.Errorf("the output lacks %s:\n%s", want, j.stdout)
				}
			}
			for _, stage := range []string{"once", "counts"} {
				dl, err := admin.OpenDeadLetters(c, plan, stage)
				if err != nil {
					t.Fatal(err)
				}
				list, err := dl.List(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range list {
					if want := "partition 0 of stage " + stage + " already holds max_keys = 2 keys"; d.Envelope.Error != want {
						t.Errorf("%s: a dead letter says %q, want %q", stage, d.Envelope.Error, want)
					}
				}
			}
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			for stage, want := range map[string]string{"once": "2", "counts": "0"} {
				v, _, err := c.ReadState(context.Background(), keys.State("in", 0, stage), stages.KeyCountKey)
				if err != nil {
					t.Fatal(err)
				}
				if string(v) != want {
					t.Errorf("%s counts %q keys at the end, want %s", stage, v, want)
				}
			}
		})
	}
}

// writeEarlierState writes, before a run of plan, the state that an earlier flowrun left to a
// stateful stage on partition 0 of topic in: the state hash's fields and values, and timers (each
// member due at its score). It returns the state hash and the timer set.
func writeEarlierState(t *testing.T, c *redis.Client, plan *flow.Plan, stage string, fields []any, timers ...goredis.Z) (hash, timersKey string) {
	t.Helper()
	ctx := context.Background()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	hash, timersKey = keys.State("in", 0, stage), keys.Timers("in", 0, stage)
	if err := c.Universal().HSet(ctx, hash, fields...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Universal().ZAdd(ctx, timersKey, timers...).Err(); err != nil {
		t.Fatal(err)
	}
	return hash, timersKey
}

// An aggregate stage upgraded in place goes on from the state that an earlier flowrun wrote, a
// timer per window ("w:<group>\x00<start>"), while the windows it opens share timers. Before the
// job the state holds u0's window [0, 1m) of 5 events, due at 1m, and u1's [1m, 2m) of 7, due at
// 2m; the job's 30 events come from 1m to 2m, for u0, u1 and u2 in turn. The old timers close the
// old windows, u1's with its 10 new events in it, and each window is emitted once; then the state
// holds no window, group, count or timer.
func TestAggregateGoesOnFromTimersOfAWindowEach(t *testing.T) {
	src := `
pipeline "upgraded" {}
variable "out" {}
topic "in" {
  partitions = 1
  key        = msg.user
}
source "gen" {
  kind   = "generate"
  count  = 30
  output = topic.in
  template = {
    user = "u${index % 3}"
    at   = 60000 + index * 2000
  }
}
stage "agg" {
  kind       = "aggregate"
  input      = topic.in
  group_by   = msg.user
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "out" {
  kind  = "file"
  input = stage.agg
  path  = var.out
}
`
	oldState := []any{
		"w:u0\x000", `{"g":"u0","s":0,"e":60000,"f":[{"n":5}]}`,
		"g:u0", `{"w":[{"i":0,"s":0,"e":60000}]}`,
		"w:u1\x0060000", `{"g":"u1","s":60000,"e":120000,"f":[{"n":7}]}`,
		"g:u1", `{"w":[{"i":60000,"s":60000,"e":120000}]}`,
		stages.KeyCountKey, "2",
	}
	want := map[string]float64{"u0 0": 5, "u0 60000": 10, "u1 60000": 17, "u2 60000": 10}
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, src, "out="+out)
			hash, timersKey := writeEarlierState(t, c, plan, "agg", oldState,
				goredis.Z{Score: 60000, Member: "w:u0\x000"}, goredis.Z{Score: 120000, Member: "w:u1\x0060000"})
			runJob(t, c, plan, runtime.Options{})
			got := map[string]float64{}
			for _, m := range jsonLines(t, readFile(t, out)) {
				start, err := time.Parse(time.RFC3339, m["window"].(map[string]any)["start"].(string))
				if err != nil {
					t.Fatal(err)
				}
				w := m["key"].(string) + " " + strconv.FormatInt(start.UnixMilli(), 10)
				if _, twice := got[w]; twice {
					t.Errorf("window %s emitted twice", w)
				}
				got[w] = m["n"].(float64)
			}
			if !maps.Equal(got, want) {
				t.Errorf("results %v, want %v", got, want)
			}
			state, err := c.Universal().HGetAll(ctx, hash).Result()
			if err != nil {
				t.Fatal(err)
			}
			delete(state, redis.WatermarkField)
			if count := state[stages.KeyCountKey]; count != "0" {
				t.Errorf("the group count is %q, want 0", count)
			}
			delete(state, stages.KeyCountKey)
			if len(state) != 0 {
				t.Errorf("the state still holds %q", state)
			}
			if n, err := c.Universal().ZCard(ctx, timersKey).Result(); err != nil || n != 0 {
				t.Errorf("%d timers left (%v), want none", n, err)
			}
		})
	}
}
