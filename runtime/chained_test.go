package runtime_test

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// An aggregate of an aggregate's results: clicks counted per user and second, then per second over
// all users, by the first's windows' start (event_time = msg.window.start, or, named nowhere, the
// event time its results carry, which is the same). The second aggregate's watermark is what the
// first passes on to its results (the earliest start a later result can have), so no result of
// the first is late for the second and each second's total is every click of that second, on every
// backend, as a job and as a service, fused or not.
func TestAnAggregateOfAnAggregate(t *testing.T) {
	t.Parallel()
	const n, users = 600, 7
	pipeline := func(secondEventTime, out string) string {
		return `
pipeline "chained" {}
topic "clicks" {
  partitions = 4
  key        = msg.user
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(n) + `
  output = topic.clicks
  # A click every 7ms, users in turn: every second has clicks of every user.
  template = {
    user = "u${index % ` + strconv.Itoa(users) + `}"
    ts   = 1700000000000 + index * 7
  }
}
stage "per_user" {
  kind         = "aggregate"
  input        = topic.clicks
  group_by     = msg.user
  event_time   = msg.ts
  idle_timeout = "200ms"
  late         = "dead_letter"
  window {
    type = "tumbling"
    size = "1s"
  }
  aggregate = { n = count() }
}
stage "per_second" {
  kind         = "aggregate"
  input        = stage.per_user
  group_by     = "all"
  ` + secondEventTime + `
  idle_timeout = "200ms"
  late         = "dead_letter"
  window {
    type = "tumbling"
    size = "1s"
  }
  aggregate = { clicks = sum(msg.n), users = count() }
}
sink "out" {
  kind  = "file"
  input = stage.per_second
  path  = "` + out + `"
}
`
	}
	// The model: clicks per second, and the users who clicked in it.
	want := map[string]int64{}
	clickers := map[string]map[string]bool{}
	for i := 0; i < n; i++ {
		ts := int64(1700000000000 + i*7)
		start := time.UnixMilli(ts - ts%1000).UTC().Format(time.RFC3339Nano)
		want[start]++
		if clickers[start] == nil {
			clickers[start] = map[string]bool{}
		}
		clickers[start][fmt.Sprintf("u%d", i%users)] = true
	}
	check := func(t *testing.T, out string) {
		t.Helper()
		got := map[string]int64{}
		for _, m := range jsonLines(t, readFile(t, out)) {
			w := m["window"].(map[string]any)
			start := fmt.Sprint(w["start"])
			if _, dup := got[start]; dup {
				t.Errorf("second %s emitted twice", start)
			}
			got[start] = int64(m["clicks"].(float64))
			if u := int(m["users"].(float64)); u != len(clickers[start]) {
				t.Errorf("second %s: %d users' results, want %d", start, u, len(clickers[start]))
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("clicks per second %v, want %v", got, want)
		}
	}
	for _, eventTime := range []string{"event_time = msg.window.start", "# the event time its input carries"} {
		for _, b := range allBackends {
			for _, noFusion := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/nofusion=%v", eventTime[:10], b.name, noFusion), func(t *testing.T) {
					c := b.open(t)
					out := filepath.Join(t.TempDir(), "out.jsonl")
					j := runJob(t, c, buildSource(t, pipeline(eventTime, out)), runtime.Options{NoFusion: noFusion, BatchSize: 37})
					for _, name := range []string{"per_user", "per_second"} {
						if s := j.node(t, name); s.Late != 0 || s.DeadLettered != 0 {
							t.Errorf("%s: %d late, %d dead-lettered, want none", name, s.Late, s.DeadLettered)
						}
					}
					check(t, out)
				})
			}
		}
	}
	t.Run("service", func(t *testing.T) {
		c := server.open(t)
		out := filepath.Join(t.TempDir(), "out.jsonl")
		run := runInBackground(t, buildSource(t, pipeline("event_time = msg.window.start", out)), runtime.Options{Redis: c})
		// The source stops; the writers idle, their watermarks move with the clock, and the last
		// seconds close without a job's end.
		waitFor(t, "every second's result", func() bool {
			return len(jsonLines(t, readFileIfAny(t, out))) == len(want)
		})
		if err := run.stop(); err != nil {
			t.Fatalf("%v\n%s", err, run.log.String())
		}
		check(t, out)
		for _, name := range []string{"per_user", "per_second"} {
			if s := summaryNode(run.summary, name); s.Late != 0 || s.DeadLettered != 0 {
				t.Errorf("%s: %d late, %d dead-lettered, want none", name, s.Late, s.DeadLettered)
			}
		}
	})
}

// readFileIfAny reads a file that a sink may not have made yet: "" until it has.
func readFileIfAny(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWindowsBeyondABatchsTimers: a batch fires at most 16 pages of a batch's size of timers, so
// that a commit stays bounded; with batches of 2, the 240 windows that close at once (the job's
// end, and mid-stream as time passes 4 windows a second for 60 users) need many turns. Every
// window is emitted once, and none of them is late for the aggregate of their results: the
// watermark passed on waits at the earliest window not yet emitted, and the input closes only after
// the last.
func TestWindowsBeyondABatchsTimers(t *testing.T) {
	t.Parallel()
	const n, users = 2400, 60
	src := `
pipeline "many" {}
topic "clicks" {
  partitions = 2
  key        = msg.user
}
source "gen" {
  kind   = "generate"
  count  = ` + strconv.Itoa(n) + `
  output = topic.clicks
  template = {
    user = "u${index % ` + strconv.Itoa(users) + `}"
    ts   = 1700000000000 + index * 5
  }
}
stage "per_user" {
  kind         = "aggregate"
  input        = topic.clicks
  group_by     = msg.user
  event_time   = msg.ts
  idle_timeout = "0s"
  window {
    type = "tumbling"
    size = "1s"
  }
  aggregate = { n = count() }
}
stage "per_second" {
  kind         = "aggregate"
  input        = stage.per_user
  group_by     = "all"
  event_time   = msg.window.start
  idle_timeout = "0s"
  window {
    type = "tumbling"
    size = "1s"
  }
  aggregate = { clicks = sum(msg.n), users = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.per_second
}
`
	for _, b := range []backend{server, embeddedRedis} {
		t.Run(b.name, func(t *testing.T) {
			j := runJob(t, b.open(t), buildSource(t, src), runtime.Options{BatchSize: 2})
			for _, name := range []string{"per_user", "per_second"} {
				if s := j.node(t, name); s.Late != 0 || s.DeadLettered != 0 {
					t.Errorf("%s: %d late, %d dead-lettered, want none", name, s.Late, s.DeadLettered)
				}
			}
			if w := j.node(t, "per_user").Written; w != n*5/1000*users {
				t.Errorf("per_user emitted %d results, want %d", w, n*5/1000*users)
			}
			seconds := jsonLines(t, j.stdout)
			if len(seconds) != n*5/1000 {
				t.Errorf("%d seconds' results, want %d", len(seconds), n*5/1000)
			}
			for _, s := range seconds {
				if s["clicks"] != float64(200) || s["users"] != float64(users) {
					t.Errorf("second %v: %v clicks by %v users, want 200 by %d", s["window"], s["clicks"], s["users"], users)
				}
			}
		})
	}
}
