package runtime_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A dedupe stage passes the first message of each pair and drops the second, a second later in
// event time; it forgets each key once its partition's watermark is within past the key's first
// message, by its own time, while traffic goes on: what it still remembers is exactly the keys
// whose time is not up, each with its timer, and its count of keys is theirs.
func TestDedupeDropsDuplicatesAndForgetsKeysByTheirOwnTime(t *testing.T) {
	const pairs, keys = 100, 10
	const within = 5 * time.Minute
	src := `
pipeline "dedupe" {}
variable "out" {}
topic "in" {
  partitions = 3
  key        = msg.key
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(2*pairs) + `
  output = topic.in
  # Pairs of the same key, a second apart; each key comes back every ten minutes.
  template = {
    key  = "k${floor(index / 2) % ` + strconv.Itoa(keys) + `}"
    pair = floor(index / 2)
    at   = floor(index / 2) * 60000 + index % 2 * 1000
  }
}
stage "once" {
  kind       = "dedupe"
  input      = topic.in
  key        = msg.key
  within     = "5m"
  event_time = msg.at
}
sink "out" {
  kind  = "file"
  input = stage.once
  path  = var.out
}
`
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, src, "out="+out)
			j := runJob(t, c, plan, runtime.Options{})
			if n := j.node(t, "once"); n.In != 2*pairs || n.Filtered != pairs || n.Out != pairs || n.Duplicates != pairs {
				t.Fatalf("once: %+v, want %d in, %d filtered, %d out, %d duplicates", n, 2*pairs, pairs, pairs, pairs)
			}
			got := jsonLines(t, readFile(t, out))
			if dups := tally(t, countBy(t, got, "pair"), pairs); dups > 0 {
				t.Fatalf("%d pairs passed twice", dups)
			}
			for _, m := range got {
				if at, _ := m["at"].(float64); int64(at)%60000 != 0 {
					t.Fatalf("the second of a pair passed: %v", m)
				}
			}

			ctx := context.Background()
			keysOf := redis.Keys{Prefix: plan.KeyPrefix}
			remembered := 0
			for p := 0; p < 3; p++ {
				state, err := c.Universal().HGetAll(ctx, keysOf.State("in", p, "once")).Result()
				if err != nil {
					t.Fatal(err)
				}
				wm, err := strconv.ParseInt(state["\x00watermark"], 10, 64)
				if err != nil {
					t.Fatalf("partition %d: no watermark in its state: %v", p, state)
				}
				timers, err := c.Universal().ZCard(ctx, keysOf.Timers("in", p, "once")).Result()
				if err != nil {
					t.Fatal(err)
				}
				delete(state, "\x00watermark")
				// The stage counts its keys in its state (max_keys), exactly.
				if count := state[stages.KeyCountKey]; count != strconv.Itoa(len(state)-1) {
					t.Errorf("partition %d: the key count is %q for %d keys", p, count, len(state)-1)
				}
				delete(state, stages.KeyCountKey)
				for key, v := range state {
					first, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						t.Fatalf("partition %d: key %s holds %q", p, key, v)
					}
					if first+within.Milliseconds() <= wm {
						t.Errorf("partition %d: key %s, first at %d, is still remembered at watermark %d", p, key, first, wm)
					}
				}
				if int(timers) != len(state) {
					t.Errorf("partition %d: %d timers for %d keys", p, timers, len(state))
				}
				remembered += len(state)
			}
			if remembered == 0 || remembered >= keys {
				t.Errorf("%d keys remembered at the end, want some of the %d but not all: the recent ones", remembered, keys)
			}
		})
	}
}

// A stateful stage's state has no time to live: a Redis whose maxmemory-policy evicts such keys
// could drop it, and the run says so at start; with the default policy it says nothing.
func TestAWarningWhenRedisMayEvictState(t *testing.T) {
	src := `
pipeline "evict" {}
topic "in" {
  partitions = 1
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = 2
  output   = topic.in
  template = { k = "a" }
}
stage "once" {
  kind   = "dedupe"
  input  = topic.in
  key    = msg.k
  within = "1h"
}
sink "out" {
  kind  = "stdout"
  input = stage.once
}
`
	for _, policy := range []string{"allkeys-lru", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			srv := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", policy))
			c := openURLs(t, srv.URL())
			j := runJob(t, c, buildSource(t, src), runtime.Options{})
			warned := strings.Contains(j.log, "may evict keys without a time to live")
			if warned != (policy == "allkeys-lru") {
				t.Fatalf("maxmemory-policy %s: warned %v\n%s", policy, warned, j.log)
			}
		})
	}
}

// flowrun validate --json estimates a dedupe stage's memory per remembered key
// (stages.DedupeBytesPerKey); on a real Redis, a partition that remembers 2000 keys of the length the
// estimate assumes takes, per key, within a quarter of it.
func TestDedupeMemoryEstimateHoldsOnRedis(t *testing.T) {
	const n = 2000
	src := `
pipeline "estimate" {}
variable "out" {}
topic "in" {
  partitions = 1
  key        = msg.id
}
source "gen" {
  kind     = "generate"
  count    = ` + strconv.Itoa(n) + `
  output   = topic.in
  template = {
    id = format("%0` + strconv.Itoa(stages.DedupeAssumedKeyLength) + `d", index)
    at = 1767225600000 + index
  }
}
stage "once" {
  kind       = "dedupe"
  input      = topic.in
  key        = msg.id
  within     = "24h"
  event_time = msg.at
}
sink "out" {
  kind  = "file"
  input = stage.once
  path  = var.out
}
`
	c := server.open(t)
	plan := buildSource(t, src, "out="+filepath.Join(t.TempDir(), "out.jsonl"))
	runJob(t, c, plan, runtime.Options{})
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	st, err := c.StateStats(context.Background(), keys.State("in", 0, "once"), keys.Timers("in", 0, "once"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Keys != n+1 || st.Timers != n || st.Bytes <= 0 {
		t.Fatalf("state %+v, want %d keys and their count, %d timers, and their memory", st, n, n)
	}
	perKey, estimate := float64(st.Bytes)/n, float64(stages.DedupeBytesPerKey(stages.DedupeAssumedKeyLength))
	if perKey < 0.75*estimate || perKey > 1.25*estimate {
		t.Fatalf("%.0f bytes per key on Redis, estimated %.0f", perKey, estimate)
	}
	t.Logf("%.0f bytes per key on Redis, estimated %.0f", perKey, estimate)
}
