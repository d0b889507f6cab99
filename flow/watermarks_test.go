package flow_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/flowrun/flowrun/flow"
)

// writersOf names the writers of a topic's watermarks, with how they write it.
func writersOf(t *testing.T, p *Plan, topic string) []string {
	t.Helper()
	tp := p.Topic(topic)
	if tp == nil || tp.Watermark == nil {
		t.Fatalf("topic %s has no watermarks", topic)
	}
	var out []string
	for _, w := range tp.Watermark.Writers {
		name := w.Name()
		if w.SamePartition {
			name += " (same partition)"
		}
		if w.Results {
			name += " (results)"
		}
		out = append(out, name)
	}
	return out
}

func domainsOf(domains []TimeDomain) []string {
	var out []string
	for _, d := range domains {
		out = append(out, d.Name)
	}
	return out
}

// TestWatermarksFollowEveryWriter: the compiler finds, for every topic that a stateful stage depends
// on, who writes it (a source, each partition of a stage, or only the same partition when the stage
// keeps the key into an unkeyed topic of as many partitions) and which event times its readers need,
// through filters, maps, declared and inserted topics, dedupes and aggregates of aggregates.
func TestWatermarksFollowEveryWriter(t *testing.T) {
	p := compileSource(t, `
pipeline "w" {}
source "in" {
  kind   = "stdin"
  output = topic.events
}
topic "events" {
  partitions = 4
  key        = msg.user
}
topic "by_region" {
  partitions = 3
  key        = msg.region
}
stage "once" {
  kind       = "dedupe"
  input      = topic.events
  key        = msg.id
  within     = "1h"
  event_time = msg.ts
}
stage "keep" {
  kind  = "filter"
  input = stage.once
  where = msg.ok
}
stage "per_user" {
  kind       = "aggregate"
  input      = stage.keep
  group_by   = msg.user
  event_time = msg.ts
  idle_timeout = "30s"
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
stage "all_users" {
  kind       = "aggregate"
  input      = stage.per_user
  group_by   = "all"
  event_time = msg.window.start
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = sum(msg.n) }
}
stage "regions" {
  kind   = "map"
  input  = topic.events
  output = topic.by_region
  set    = { seen = true }
}
stage "per_region" {
  kind     = "aggregate"
  input    = topic.by_region
  group_by = msg.region
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.all_users
}
sink "regions_out" {
  kind  = "stdout"
  input = stage.per_region
}
`, Options{})
	// events feeds the dedupe (through its repartition topic, by msg.ts) and the map (the entry's
	// time, for per_region): a source writes it, and its readers need both event times.
	if got, want := writersOf(t, p, "events"), []string{"source.in"}; !slices.Equal(got, want) {
		t.Errorf("writers of events: %v, want %v", got, want)
	}
	if got, want := domainsOf(p.Topic("events").Watermark.Domains), []string{"", "msg.ts"}; !slices.Equal(got, want) {
		t.Errorf("event times of events: %q, want %q", got, want)
	}
	// The repartition stage re-keys: each of its 4 units writes every partition.
	if got, want := writersOf(t, p, "once.by_key"), []string{"stage.once.by_key"}; !slices.Equal(got, want) {
		t.Errorf("writers of once.by_key: %v, want %v", got, want)
	}
	// The dedupe and the filter keep the key into unkeyed topics of as many partitions.
	if got, want := writersOf(t, p, "once.out"), []string{"stage.once (same partition)"}; !slices.Equal(got, want) {
		t.Errorf("writers of once.out: %v, want %v", got, want)
	}
	if got, want := writersOf(t, p, "per_user.by_key"), []string{"stage.per_user.by_key"}; !slices.Equal(got, want) {
		t.Errorf("writers of per_user.by_key: %v, want %v", got, want)
	}
	// The aggregate writes results of its own, read by their window's start.
	if got, want := writersOf(t, p, "all_users.by_key"), []string{"stage.all_users.by_key"}; !slices.Equal(got, want) {
		t.Errorf("writers of all_users.by_key: %v, want %v", got, want)
	}
	if got, want := writersOf(t, p, "per_user.out"), []string{"stage.per_user (same partition) (results)"}; !slices.Equal(got, want) {
		t.Errorf("writers of per_user.out: %v, want %v", got, want)
	}
	if got, want := domainsOf(p.Topic("per_user.out").Watermark.Domains), []string{"msg.window.start"}; !slices.Equal(got, want) {
		t.Errorf("event times of per_user.out: %q, want %q", got, want)
	}
	// The map writes a declared topic of another key: all of its units write every partition.
	if got, want := writersOf(t, p, "by_region"), []string{"stage.regions"}; !slices.Equal(got, want) {
		t.Errorf("writers of by_region: %v, want %v", got, want)
	}
	// A topic no stateful stage depends on has no watermarks.
	if w := p.Topic("all_users.out").Watermark; w != nil {
		t.Errorf("all_users.out has watermarks: %+v", w)
	}
	// Idle writers move on after the shortest idle_timeout of the stateful stages they feed.
	if got := p.Topic("events").Watermark.IdleTimeout; got != 30*time.Second {
		t.Errorf("idle timeout of events: %s, want 30s (per_user's)", got)
	}
	// Every stateful stage here follows writers: the rule says so, naming them.
	for _, r := range p.WatermarkRules() {
		if r.Rule != "least_of_writers" || len(r.Writers) == 0 || !strings.Contains(r.Says, "least") {
			t.Errorf("rule of %s: %+v", r.Stage, r)
		}
	}
	if st := p.Stage("per_user").Watermark; st == nil || st.Measures || st.Own < 0 || st.Domains[st.Own].Name != "msg.ts" {
		t.Errorf("per_user's watermark: %+v", st)
	}
}

// TestAStageOnATopicOfTheOutsideMeasuresIt: a topic that nothing of the pipeline writes (other
// applications do) is measured by its readers.
func TestAStageOnATopicOfTheOutsideMeasuresIt(t *testing.T) {
	p := compileSource(t, `
pipeline "m" {}
topic "clicks" {
  partitions = 2
  key        = msg.user
}
stage "per_user" {
  kind       = "aggregate"
  input      = topic.clicks
  group_by   = msg.user
  event_time = msg.ts
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.per_user
}
`, Options{})
	st := p.Stage("per_user").Watermark
	if st == nil || !st.Measures || st.IdleTimeout != time.Minute {
		t.Fatalf("per_user's watermark: %+v, want measured, idle after a minute", st)
	}
	if r := p.WatermarkRules(); len(r) != 1 || r[0].Rule != "measured" {
		t.Errorf("rules: %+v", r)
	}
}

// TestWhatWouldMakeWatermarksWrongIsRefused: a map that changes a field a later stage's event_time
// reads, and ordering = "none" before a stateful stage, are located errors.
func TestWhatWouldMakeWatermarksWrongIsRefused(t *testing.T) {
	tail := `
stage "per_user" {
  kind       = "aggregate"
  input      = stage.fix
  group_by   = msg.user
  event_time = msg.ts
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.per_user
}
`
	head := `
pipeline "x" {}
source "in" {
  kind   = "stdin"
  output = topic.events
}
topic "events" {
  partitions = 2
  key        = msg.user
}
`
	for _, tc := range []struct{ name, stage, want, at string }{
		{"a map sets the event time", `
stage "fix" {
  kind  = "map"
  input = topic.events
  set   = { ts = msg.ts * 1000 }
}`, "changes msg.ts, which a later stage reads as its event time", "{ ts = msg.ts * 1000 }"},
		{"a map drops it", `
stage "fix" {
  kind  = "map"
  input = topic.events
  drop  = ["ts"]
}`, "changes msg.ts", `["ts"]`},
		{"an unordered stage", `
stage "fix" {
  kind     = "filter"
  input    = topic.events
  where    = true
  ordering = "none"
}`, `not "none"`, `"none"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := head + tc.stage + tail
			_, diags := compileDiags(t, src, Options{})
			if len(diags) != 1 || !strings.Contains(diags[0].Detail, tc.want) || diags[0].Subject == nil {
				t.Fatalf("diagnostics %v, want one error saying %q", diags, tc.want)
			}
			r := diags[0].Subject
			if got := src[r.Start.Byte:r.End.Byte]; got != tc.at {
				t.Errorf("the error is at %q, want %q", got, tc.at)
			}
		})
	}
	// A map that changes other fields is fine.
	compileSource(t, head+`
stage "fix" {
  kind  = "map"
  input = topic.events
  set   = { ts_s = msg.ts / 1000 }
}`+tail, Options{})
}
