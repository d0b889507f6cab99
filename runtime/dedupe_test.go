package runtime_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A dedupe stage passes the first message of each key and drops the copies that follow within its
// span, and forgets each key by its own time while traffic goes on. A message comes every 10s of
// event time, the seven keys in turn: a key comes back every 70s, four times within its 5 minutes
// (the fourth 20s before they are up: dropped) and a fifth time 50s after (passed, and remembered
// from then on). Each key's time is its own, and it is mostly the other keys' messages that move
// its partition's watermark past it. The input comes in two jobs, one after the other; after each,
// the state holds exactly the keys whose time is not up, each with the time of its first message
// and in a timer due when its time is up, and their count, and nothing else.
func TestDedupeDropsDuplicatesAndForgetsKeysByTheirOwnTime(t *testing.T) {
	t.Parallel()
	const perJob, keys, partitions = 140, 7, 3
	const step, within = int64(10_000), int64(5 * 60_000) // ms
	src := `
pipeline "dedupe" {}
variable "out" {}
variable "from" {}
topic "in" {
  partitions = 3
  key        = msg.key
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(perJob) + `
  output = topic.in
  template = {
    key = "k${(index + tonumber(var.from)) % ` + strconv.Itoa(keys) + `}"
    seq = index + tonumber(var.from)
    at  = (index + tonumber(var.from) + 1) * ` + strconv.FormatInt(step, 10) + `
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
	// The computation, in order: a message is a duplicate when its key's first message is less than
	// within before it and within of it is not up at the watermark (the latest event time that the
	// source, the one writer of every partition, has written so far); otherwise it passes and is the
	// key's first. The state is looked at once the job is done, when every partition's watermark is
	// the source's last event time.
	type memory struct {
		watermark  int64
		remembered map[string]int64 // key -> its first message's time, whose time is not up
	}
	type outcome struct {
		passed             map[int]bool // by seq
		duplicates         int
		state              [partitions]memory
		nearTheEnd, reborn int // duplicates in a key's last 30s; keys passed again after their time
		forgotten          int // keys seen in their partition that the state no longer holds
	}
	var jobs [2]outcome
	first := map[string]int64{}
	watermarks := [partitions]int64{}
	for job := range jobs {
		o := &jobs[job]
		o.passed = map[int]bool{}
		for seq := job * perJob; seq < (job+1)*perJob; seq++ {
			key, at := "k"+strconv.Itoa(seq%keys), int64(seq+1)*step
			for p := range watermarks {
				watermarks[p] = max(watermarks[p], at)
			}
			p := redis.Partition(key, partitions)
			f, seen := first[key]
			switch {
			case seen && f+within > watermarks[p] && at-f < within:
				o.duplicates++
				if at-f >= within-30_000 {
					o.nearTheEnd++
				}
			default:
				if seen {
					o.reborn++
				}
				first[key] = at
				o.passed[seq] = true
			}
		}
		for p := range o.state {
			o.state[p] = memory{watermark: watermarks[p], remembered: map[string]int64{}}
		}
		for key, f := range first {
			p := redis.Partition(key, partitions)
			if f+within > watermarks[p] {
				o.state[p].remembered[key] = f
			} else {
				o.forgotten++
			}
		}
		if o.nearTheEnd == 0 || o.reborn == 0 || o.forgotten == 0 || o.forgotten == len(first) {
			t.Fatalf("job %d: %d duplicates in a key's last 30s, %d keys passed again, %d of %d forgotten at the end: "+
				"the input does not test what it says", job, o.nearTheEnd, o.reborn, o.forgotten, len(first))
		}
	}

	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			var prefix string
			for job, want := range jobs {
				plan := buildSource(t, src, "out="+out, "from="+strconv.Itoa(job*perJob))
				if job == 0 {
					prefix = plan.KeyPrefix
				}
				plan.KeyPrefix = prefix // the same pipeline again
				j := runJob(t, c, plan, runtime.Options{})
				wantOut := int64(len(want.passed))
				if n := j.node(t, "once"); n.In != perJob || n.Out != wantOut || n.Dropped != int64(want.duplicates) || n.Duplicates != int64(want.duplicates) || n.Filtered != 0 {
					t.Fatalf("job %d: once: %+v, want %d in, %d out, %d dropped and duplicates", job, n, perJob, wantOut, want.duplicates)
				}

				keysOf := redis.Keys{Prefix: prefix}
				for p, mem := range want.state {
					state, err := c.Universal().HGetAll(ctx, keysOf.State("in", p, "once")).Result()
					if err != nil {
						t.Fatal(err)
					}
					if wm := state[redis.WatermarkField]; wm != strconv.FormatInt(mem.watermark, 10) {
						t.Errorf("job %d, partition %d: watermark %q, want %d", job, p, wm, mem.watermark)
					}
					delete(state, redis.WatermarkField)
					// The stage counts its keys in its state (max_keys), exactly.
					if count := state[stages.KeyCountKey]; count != strconv.Itoa(len(mem.remembered)) {
						t.Errorf("job %d, partition %d: the key count is %q for %d keys", job, p, count, len(mem.remembered))
					}
					delete(state, stages.KeyCountKey)
					remembered := rememberedKeys(t, c, keysOf.State("in", p, "once"))
					timers, err := c.Universal().ZRangeWithScores(ctx, keysOf.Timers("in", p, "once"), 0, -1).Result()
					if err != nil {
						t.Fatal(err)
					}
					// A timer may forget several keys (those whose first messages of a batch came at
					// the same time): each remembered key is in one, due at its time.
					due := map[string]float64{}
					for _, z := range timers {
						keys, ok := stages.TimerMembers("key:", fmt.Sprint(z.Member), nil)
						if !ok {
							t.Errorf("job %d, partition %d: a timer %q of no keys", job, p, z.Member)
						}
						for _, key := range keys {
							if _, twice := due[key]; twice {
								t.Errorf("job %d, partition %d: two timers of key %s", job, p, key)
							}
							due[key] = z.Score
						}
					}
					wantState, wantDue := map[string]string{}, map[string]float64{}
					for key, f := range mem.remembered {
						wantState[key] = strconv.FormatInt(f, 10)
						wantDue[key] = float64(f + within)
					}
					if !maps.Equal(remembered, wantState) || !maps.Equal(due, wantDue) {
						t.Errorf("job %d, partition %d at watermark %d: remembers %v with timers %v, want %v with timers %v",
							job, p, mem.watermark, remembered, due, wantState, wantDue)
					}
				}
			}
			passed := map[int]int{}
			for job := range jobs {
				for seq := range jobs[job].passed {
					passed[seq] = 1
				}
			}
			if got := countBy(t, jsonLines(t, readFile(t, out)), "seq"); !maps.Equal(got, passed) {
				t.Errorf("passed %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(passed)))
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
	if remembered := rememberedKeys(t, c, keys.State("in", 0, "once")); len(remembered) != n || st.Timers != n || st.Bytes <= 0 {
		t.Fatalf("state %+v remembering %d keys, want %d keys, %d timers, and their memory", st, len(remembered), n, n)
	}
	perKey, estimate := float64(st.Bytes)/n, float64(stages.DedupeBytesPerKey(stages.DedupeAssumedKeyLength))
	if perKey < 0.75*estimate || perKey > 1.25*estimate {
		t.Fatalf("%.0f bytes per key on Redis, estimated %.0f", perKey, estimate)
	}
	t.Logf("%.0f bytes per key on Redis, estimated %.0f", perKey, estimate)
}

// A dedupe stage upgraded in place goes on from the state that an earlier flowrun wrote, a timer
// per key ("key:<key>"), while it writes timers that keys share: the keys whose first messages
// come at the same time. Before the job the state remembers old1 (its minute is up at 61s) and
// old2 (at 110s); the job's 58 new keys come ten to a second from 60s to 65s, then old1 (its
// minute up: passed, remembered from 65s) and old2 (a duplicate). The state then holds exactly
// the 60 keys, each with its first time and in a timer due a minute later, and their count.
func TestDedupeGoesOnFromTimersOfAKeyEach(t *testing.T) {
	t.Parallel()
	const within = int64(60_000)
	src := `
pipeline "upgraded" {}
variable "out" {}
topic "in" {
  partitions = 1
  key        = msg.key
}
source "gen" {
  kind   = "generate"
  count  = 60
  output = topic.in
  template = {
    key = index < 58 ? "n${index}" : (index == 58 ? "old1" : "old2")
    at  = index < 58 ? 60000 + floor(index / 10) * 1000 : 65000
  }
}
stage "once" {
  kind       = "dedupe"
  input      = topic.in
  key        = msg.key
  within     = "1m"
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
			ctx := context.Background()
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, src, "out="+out)
			hash, timersKey := writeEarlierState(t, c, plan, "once", []any{"old1", "1000", "old2", "50000", stages.KeyCountKey, "2"},
				goredis.Z{Score: 61000, Member: "key:old1"}, goredis.Z{Score: 110000, Member: "key:old2"})
			j := runJob(t, c, plan, runtime.Options{})
			if n := j.node(t, "once"); n.In != 60 || n.Out != 59 || n.Duplicates != 1 {
				t.Fatalf("once: %+v, want 60 in, 59 out, 1 duplicate (old2)", n)
			}
			wantState := map[string]string{"old1": "65000", "old2": "50000"}
			for i := range 58 {
				wantState["n"+strconv.Itoa(i)] = strconv.Itoa(60000 + i/10*1000)
			}
			state, err := c.Universal().HGetAll(ctx, hash).Result()
			if err != nil {
				t.Fatal(err)
			}
			if count := state[stages.KeyCountKey]; count != strconv.Itoa(len(wantState)) {
				t.Errorf("the key count is %q for %d keys", count, len(wantState))
			}
			// The new keys are packed; old1, passed again, left its field of its own for them; old2
			// keeps its own.
			for field := range state {
				if !strings.HasPrefix(field, "\x00") && field != "old2" {
					t.Errorf("the state has a field %q besides the records of keys", field)
				}
			}
			if remembered := rememberedKeys(t, c, hash); !maps.Equal(remembered, wantState) {
				t.Errorf("state %v, want %v", remembered, wantState)
			}
			timers, err := c.Universal().ZRangeWithScores(ctx, timersKey, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			due := map[string]int64{}
			for _, z := range timers {
				members, ok := stages.TimerMembers("key:", fmt.Sprint(z.Member), nil)
				if !ok {
					t.Errorf("a timer %q of no keys", z.Member)
				}
				for _, key := range members {
					due[key] = int64(z.Score)
				}
			}
			for key, first := range wantState {
				f, _ := strconv.ParseInt(first, 10, 64)
				if due[key] != f+within {
					t.Errorf("key %s (first at %d) is in a timer due at %d, want %d", key, f, due[key], f+within)
				}
			}
			if len(due) != len(wantState) {
				t.Errorf("timers of %d keys, want %d: %v", len(due), len(wantState), due)
			}
		})
	}
}

// A dedupe packs its keys (state.PackedKeys): a batch's commit writes its new keys as one field of
// the state hash, and the partition's owner keeps them all, so that it reads none from Redis. A
// second job, in a new process (a new lease) with keys of the first again, drops every one of
// them, and passes its new keys: the new owner read the records before its first batch.
func TestDedupeKeepsItsKeysPacked(t *testing.T) {
	t.Parallel()
	const perJob = 20_000
	src := `
pipeline "dedupe_reads" {}
variable "from" {}
topic "in" {
  partitions = 1
  key        = msg.id
}
topic "out" {
  partitions = 1
}
source "gen" {
  kind     = "generate"
  count    = ` + strconv.Itoa(perJob) + `
  output   = topic.in
  template = {
    id = "k${index + tonumber(var.from)}"
    at = 1000 + index
  }
}
stage "once" {
  kind       = "dedupe"
  input      = topic.in
  output     = topic.out
  key        = msg.id
  within     = "24h"
  event_time = msg.at
}
`
	srv := redistest.Start(t) // its own: the test counts the commands the run sends
	c := openURLs(t, srv.URL())
	ctx := context.Background()
	hmgets := func() int64 {
		t.Helper()
		stats, err := c.Universal().Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(stats, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_hmget:calls="); ok {
				n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		return 0
	}

	first := buildSource(t, src, "from=0")
	j := runJob(t, c, first, runtime.Options{})
	if n := j.node(t, "once"); n.In != perJob || n.Out != perJob || n.Duplicates != 0 {
		t.Fatalf("job 1: once: %+v, want %d in and out", n, perJob)
	}
	// A batch reads ahead only the state's own entries (the count of keys) that its owner did not
	// write yet.
	batches := int64(perJob / 1000)
	if n := hmgets(); n > 3 {
		t.Fatalf("job 1 read the state %d times in about %d batches of new keys, want at most 3 (its own entries)", n, batches)
	}

	// Job 2: the second half of job 1's keys, then as many new ones.
	second := buildSource(t, src, "from="+strconv.Itoa(perJob/2))
	second.KeyPrefix = first.KeyPrefix
	before := hmgets()
	j = runJob(t, c, second, runtime.Options{})
	if n := j.node(t, "once"); n.In != perJob || n.Out != perJob/2 || n.Duplicates != perJob/2 {
		t.Fatalf("job 2: once: %+v, want %d in, %d out and %d duplicates", n, perJob, perJob/2, perJob/2)
	}
	if n := hmgets() - before; n > 3 {
		t.Fatalf("job 2 read the state %d times in about %d batches, want at most 3 (its own entries)", n, batches)
	}
	hash := redis.Keys{Prefix: first.KeyPrefix}.State("in", 0, "once")
	held, err := c.Universal().HLen(ctx, hash).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The records of about 2*batches batches, the count and the watermark: not a field per key.
	if held > 3*batches+2 {
		t.Fatalf("the state holds %d fields for %d keys in about %d batches", held, perJob+perJob/2, 2*batches)
	}
	remembered := rememberedKeys(t, c, hash)
	for i := range perJob + perJob/2 {
		first := 1000 + i // job 1's, and job 2's of the first half
		if i >= perJob {
			first -= perJob / 2 // job 2's new keys
		}
		if at := remembered["k"+strconv.Itoa(i)]; at != strconv.Itoa(first) {
			t.Fatalf("k%d is remembered from %q, want %d", i, at, first)
		}
	}
	if len(remembered) != perJob+perJob/2 {
		t.Fatalf("the state remembers %d keys, want %d", len(remembered), perJob+perJob/2)
	}
}

// rememberedKeys returns the keys that a dedupe stage's state hash holds, with the first times of
// their messages, as the partition's next owner reads them: from its records of keys, and from the
// fields of a key each that an earlier flowrun wrote.
func rememberedKeys(t *testing.T, c *redis.Client, hash string) map[string]string {
	t.Helper()
	st, err := state.ReadPackedKeys(context.Background(), c, hash)
	if err != nil {
		t.Fatal(err)
	}
	return st.Keys()
}
