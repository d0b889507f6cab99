package runtime_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// The two repros of issue 22, fixed: clicks whose event times strictly increase, so that nothing
// can be late, counted per user and minute after a chain that re-keys them on the way. Before the
// watermark followed every writer of a topic, events came late and windows came out wrong, and
// different from run to run; with batches of 50, the last minutes' windows of some users were
// missing now and then (a batch fired at most a batch's worth of timers, and a job's closing batch
// is a partition's last).

// click is one line of the repros' input file.
type click struct {
	ID   string `json:"id"`
	User string `json:"user"`
	Kind string `json:"kind"`
	TS   int64  `json:"ts"`
}

const (
	reproEvents = 5000
	reproUsers  = 17
	reproBase   = int64(1700000000000)
)

// reproClicks are reproEvents events of distinct ids, users drawn at random (so the partitions
// fill unevenly and their writers move at different paces), event times strictly increasing by 1 to
// 400ms, about one in seven a "view" rather than a "click"; and, every 11th event, a duplicate (the
// same id and payload) two to five lines after its original, so less than 2s behind: within grace.
func reproClicks() []click {
	rng := rand.New(rand.NewPCG(22, 2022))
	var out []click
	var dups []struct {
		at int
		c  click
	}
	ts := reproBase
	for i := 0; i < reproEvents; i++ {
		ts += 1 + rng.Int64N(400)
		kind := "click"
		if rng.IntN(7) == 0 {
			kind = "view"
		}
		c := click{ID: fmt.Sprintf("e%05d", i), User: fmt.Sprintf("u%02d", rng.IntN(reproUsers)), Kind: kind, TS: ts}
		out = append(out, c)
		if i%11 == 0 {
			dups = append(dups, struct {
				at int
				c  click
			}{i + 2 + rng.IntN(4), c})
		}
		for len(dups) > 0 && dups[0].at == i {
			out = append(out, dups[0].c)
			dups = dups[1:]
		}
	}
	for _, d := range dups {
		out = append(out, d.c)
	}
	return out
}

// writeClicks writes the clicks as a file of JSON lines in a temporary directory.
func writeClicks(t *testing.T, clicks []click) string {
	t.Helper()
	var b strings.Builder
	for _, c := range clicks {
		line, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "clicks.jsonl")
	writeFile(t, path, b.String())
	return path
}

// perUserMinute is the model: the count of the clicks that keep counts, per user and minute
// (RFC 3339, UTC, as an aggregate's window start).
func perUserMinute(clicks []click, keep func(click) bool) map[aggregateWindow]int {
	want := map[aggregateWindow]int{}
	for _, c := range clicks {
		if keep(c) {
			want[aggregateWindow{c.User, time.UnixMilli(c.TS - c.TS%60000).UTC().Format(time.RFC3339), ""}]++
		}
	}
	return want
}

// checkPerUserMinute checks an aggregate's results against the model: every window once, with its
// count n, and no other.
func checkPerUserMinute(t *testing.T, out string, want map[aggregateWindow]int) {
	t.Helper()
	got := map[aggregateWindow]int{}
	for _, m := range jsonLines(t, readFile(t, out)) {
		w := windowOf(m)
		if _, dup := got[w]; dup {
			t.Errorf("window %v emitted twice", w)
		}
		got[w] = int(m["n"].(float64))
	}
	wrong := 0
	for w, n := range want {
		if got[w] != n {
			if wrong++; wrong <= 10 {
				t.Errorf("window %v: n = %d, want %d", w, got[w], n)
			}
		}
	}
	for w, n := range got {
		if _, ok := want[w]; !ok {
			if wrong++; wrong <= 10 {
				t.Errorf("window %v: n = %d, not in the model", w, n)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d windows wrong (%d emitted)", wrong, len(want), len(got))
	}
}

// noneLate checks that the aggregate found nothing late, that nothing reached the late topic's
// file, and that nothing was dead-lettered anywhere.
func noneLate(t *testing.T, j job, late string) {
	t.Helper()
	if s := j.node(t, "per_minute"); s.Late != 0 {
		t.Errorf("per_minute: %d late, want none", s.Late)
	}
	if got := readFileIfAny(t, late); got != "" {
		t.Errorf("%d events on topic.late, want none", len(jsonLines(t, got)))
	}
	if d := j.summary.DeadLettered(); d != 0 {
		t.Errorf("%d dead-lettered, want none\n%s", d, j.log)
	}
}

// reproRuns runs a repro on every backend, fused and not, with batches of 50 (many batches, many
// interleavings of the writers), and on the server with the default batch (1000) too.
func reproRuns(t *testing.T, run func(t *testing.T, b backend, opts runtime.Options)) {
	for _, b := range allBackends {
		batches := []int{50}
		if b.name == server.name {
			batches = append(batches, 0)
		}
		for _, batch := range batches {
			for _, noFusion := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/batch=%d/nofusion=%v", b.name, batch, noFusion), func(t *testing.T) {
					run(t, b, runtime.Options{NoFusion: noFusion, BatchSize: batch})
				})
			}
		}
	}
}

// Issue 22's first repro: clicks on a topic keyed by user, deduplicated by id (through the
// inserted topic once.by_key), counted per user and minute (through per_minute.by_key). The
// dedupe drops every duplicate, and the aggregate finds nothing late: its windows are exactly the
// distinct ids per user and minute.
func TestIssue22DedupeThenWindows(t *testing.T) {
	t.Parallel()
	clicks := reproClicks()
	distinct := map[string]bool{}
	want := perUserMinute(clicks, func(c click) bool {
		first := !distinct[c.ID]
		distinct[c.ID] = true
		return first
	})
	path := writeClicks(t, clicks)
	src := `
pipeline "repro22" {}
variable "in" {}
variable "out" {}
variable "late" {}
topic "events" {
  partitions = 4
  key        = msg.user
}
topic "late" {}
source "in" {
  kind   = "file"
  path   = var.in
  output = topic.events
}
stage "once" {
  kind       = "dedupe"
  input      = topic.events
  key        = msg.id
  within     = "2h"
  event_time = msg.ts
}
stage "per_minute" {
  kind       = "aggregate"
  input      = stage.once
  group_by   = msg.user
  event_time = msg.ts
  window {
    type = "tumbling"
    size = "1m"
  }
  grace     = "30s"
  late      = topic.late
  aggregate = { n = count() }
}
sink "out" {
  kind  = "file"
  input = stage.per_minute
  path  = var.out
}
sink "late_out" {
  kind  = "file"
  input = topic.late
  path  = var.late
}
`
	reproRuns(t, func(t *testing.T, b backend, opts runtime.Options) {
		c := b.open(t)
		dir := t.TempDir()
		out, late := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "late.jsonl")
		plan := buildSource(t, src, "in="+path, "out="+out, "late="+late)
		j := runJob(t, c, plan, opts)
		if s := j.node(t, "once"); s.In != int64(len(clicks)) || s.Duplicates != int64(len(clicks)-len(distinct)) {
			t.Errorf("once: %d in, %d duplicates, want %d and %d", s.In, s.Duplicates, len(clicks), len(clicks)-len(distinct))
		}
		noneLate(t, j, late)
		checkPerUserMinute(t, out, want)
	})
}

// Issue 22's second repro: a filter (fused with a map before it, unless NoFusion) reads a topic
// keyed by id and writes a declared topic keyed by user, which the aggregate reads as it is (no
// inserted topic). Every partition of events writes every partition of by_user, so each of
// by_user's watermarks is the least of the four writers'; the aggregate finds nothing late and its
// windows are exactly the clicks per user and minute (duplicates too: nothing dedupes them, and
// they are within grace).
func TestIssue22DeclaredTopicThenWindows(t *testing.T) {
	t.Parallel()
	clicks := reproClicks()
	want := perUserMinute(clicks, func(c click) bool { return c.Kind == "click" })
	inWindows := 0
	for _, n := range want {
		inWindows += n
	}
	path := writeClicks(t, clicks)
	src := `
pipeline "repro22b" {}
variable "in" {}
variable "out" {}
variable "late" {}
topic "events" {
  partitions = 4
  key        = msg.id
}
topic "by_user" {
  partitions = 3
  key        = msg.user
}
topic "late" {}
source "in" {
  kind   = "file"
  path   = var.in
  output = topic.events
}
stage "tag" {
  kind  = "map"
  input = topic.events
  set   = { seen = true }
}
stage "clicks" {
  kind   = "filter"
  input  = stage.tag
  output = topic.by_user
  where  = msg.kind == "click"
}
stage "per_minute" {
  kind       = "aggregate"
  input      = topic.by_user
  group_by   = msg.user
  event_time = msg.ts
  window {
    type = "tumbling"
    size = "1m"
  }
  grace     = "30s"
  late      = topic.late
  aggregate = { n = count() }
}
sink "out" {
  kind  = "file"
  input = stage.per_minute
  path  = var.out
}
sink "late_out" {
  kind  = "file"
  input = topic.late
  path  = var.late
}
`
	reproRuns(t, func(t *testing.T, b backend, opts runtime.Options) {
		c := b.open(t)
		dir := t.TempDir()
		out, late := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "late.jsonl")
		plan := buildSource(t, src, "in="+path, "out="+out, "late="+late)
		for _, s := range plan.Stages {
			if strings.HasSuffix(s.Name, ".by_key") {
				t.Fatalf("an inserted topic (%s): the aggregate must read by_user as it is", s.Name)
			}
		}
		j := runJob(t, c, plan, opts)
		if s := j.node(t, "clicks"); s.In != int64(len(clicks)) || s.Out != int64(inWindows) {
			t.Errorf("clicks: %d in, %d out, want %d and %d", s.In, s.Out, len(clicks), inWindows)
		}
		noneLate(t, j, late)
		checkPerUserMinute(t, out, want)
	})
}
