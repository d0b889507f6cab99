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
