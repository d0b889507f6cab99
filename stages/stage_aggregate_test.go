package stages

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
)

// sessionsSrc is an aggregate of sessions per user with a gap of 5 minutes, no grace, and every
// aggregate function; extra goes into the stage block.
func sessionsSrc(extra string) string {
	return `
stage "sessions" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  window {
    type = "session"
    gap  = "5m"
  }
  aggregate = {
    n     = count()
    total = sum(msg.amount)
    low   = min(msg.amount)
    high  = max(msg.amount)
    mean  = avg(msg.amount)
    pages = count_distinct(msg.page)
    top   = top_k(msg.page, 1)
    first = first(msg.page)
    last  = last(msg.page)
  }
` + extra + `
}
` + sinkA
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// event is a payload of user's at minutes past epoch.
func event(user string, minutes float64, amount int, page string) string {
	at := epoch.Add(time.Duration(minutes * float64(time.Minute))).Format(time.RFC3339Nano)
	return fmt.Sprintf(`{"user":%q,"at":%q,"amount":%d,"page":%q}`, user, at, amount, page)
}

// windows describes the results, one a line: the key, the window in minutes past epoch, and the
// fields the test names.
func windows(t *testing.T, outs []Output, fields ...string) string {
	t.Helper()
	var lines []string
	for _, o := range outs {
		var v map[string]any
		if err := json.Unmarshal([]byte(payloadOf(t, o)), &v); err != nil {
			t.Fatal(err)
		}
		w := v["window"].(map[string]any)
		line := fmt.Sprintf("%s [%s, %s)", v["key"], minutesOf(t, w["start"]), minutesOf(t, w["end"]))
		for _, f := range fields {
			b, _ := json.Marshal(v[f])
			line += fmt.Sprintf(" %s=%s", f, b)
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

func minutesOf(t *testing.T, v any) string {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, v.(string))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(at.Sub(epoch).Minutes())
}

func wantWindows(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\ngot\n%s\nwant\n%s", what, got, want)
	}
}

func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

// A session lasts from its first event to gap after its last: events at 0, 2 and 4 minutes are one
// session [0, 9m), which the event at 20 minutes closes, and which starts one of its own.
func TestSessionsEndGapAfterTheirLastEvent(t *testing.T) {
	proc, st := statefulProcessor(t, sessionsSrc(""), "sessions")
	outs, errs := st.batch(t, proc, event("u1", 0, 5, "a"), event("u1", 2, 1, "b"), event("u2", 3, 7, "a"), event("u1", 4, 3, "b"))
	noErrors(t, errs)
	wantWindows(t, "before the gap passes", windows(t, outs), "")
	outs, errs = st.batch(t, proc, event("u1", 20, 2, "c"))
	noErrors(t, errs)
	wantWindows(t, "once the watermark passes 9m", windows(t, outs, "n", "total", "low", "high", "mean", "pages", "top", "first", "last"),
		`u2 [3, 8) n=1 total=7 low=7 high=7 mean=7 pages=1 top=["a"] first="a" last="a"`+"\n"+
			`u1 [0, 9) n=3 total=9 low=1 high=5 mean=3 pages=2 top=["b"] first="a" last="b"`)
	if n := st.keyCount(t); n != 1 {
		t.Errorf("%d groups with open sessions counted, want 1 (u1's second session)", n)
	}
	wantWindows(t, "at the end of the input", windows(t, st.end(t, proc), "n", "total"), "u1 [20, 25) n=1 total=2")
	if n := st.keyCount(t); n != 0 || len(st.values) != 1 || len(st.timers) != 0 {
		t.Errorf("after every session closed: key count %d, state %q, timers %v; want only the key count, 0", n, st.values, st.timers)
	}
}

// An event less than gap away from two sessions merges them: the merged session has both's
// accumulators and the event's, and the session merged into it emits nothing of its own. (A grace of
// 10 minutes keeps the first session open while the second begins.)
func TestAnEventThatBridgesTwoSessionsMergesThem(t *testing.T) {
	proc, st := statefulProcessor(t, sessionsSrc(`  grace = "10m"`), "sessions")
	_, errs := st.batch(t, proc, event("u1", 0, 5, "a"), event("u1", 8, 1, "b"), event("u1", 10, 9, "c"))
	noErrors(t, errs)
	if got := len(st.timers); got != 2 {
		t.Fatalf("%d timers, want 2: one per session, [0, 5m) and [8m, 15m)", got)
	}
	// [4m, 9m) overlaps [0, 5m) and [8m, 15m).
	outs, errs := st.batch(t, proc, event("u1", 4, 2, "b"))
	noErrors(t, errs)
	wantWindows(t, "after the merge", windows(t, outs), "")
	if got := len(st.timers); got != 1 {
		t.Fatalf("%d timers after the merge, want 1: %v", got, st.timers)
	}
	wantWindows(t, "at the end", windows(t, st.end(t, proc), "n", "total", "low", "high", "mean", "pages", "top", "first", "last"),
		`u1 [0, 15) n=4 total=17 low=1 high=9 mean=4.25 pages=3 top=["b"] first="a" last="c"`)
}

// With emit = "on_update" a session emits after each batch that changed it, and once more when it
// closes; once merged, the session merged into another emits nothing more.
func TestOnUpdateSessionsEmitTheMergedSession(t *testing.T) {
	proc, st := statefulProcessor(t, sessionsSrc(`  emit = "on_update"`+"\n"+`  grace = "10m"`), "sessions")
	outs, errs := st.batch(t, proc, event("u1", 0, 5, "a"), event("u1", 8, 1, "b"))
	noErrors(t, errs)
	wantWindows(t, "the first batch", windows(t, outs, "n"), "u1 [0, 5) n=1\nu1 [8, 13) n=1")
	outs, errs = st.batch(t, proc, event("u1", 4, 2, "b"))
	noErrors(t, errs)
	wantWindows(t, "the batch that merged them", windows(t, outs, "n"), "u1 [0, 13) n=3")
	outs, errs = st.batch(t, proc, event("u2", 30, 1, "a"))
	noErrors(t, errs)
	wantWindows(t, "the batch that closed the merged session", windows(t, outs, "n"), "u1 [0, 13) n=3\nu2 [30, 35) n=1")
}

// Within one batch too: the session merged away emits no update of its own.
func TestOnUpdateSessionsMergedInOneBatch(t *testing.T) {
	proc, st := statefulProcessor(t, sessionsSrc(`  emit = "on_update"`+"\n"+`  grace = "10m"`), "sessions")
	outs, errs := st.batch(t, proc, event("u1", 0, 5, "a"), event("u1", 8, 1, "b"), event("u1", 4, 2, "b"))
	noErrors(t, errs)
	wantWindows(t, "the batch", windows(t, outs, "n"), "u1 [0, 13) n=3")
}

// An event whose own session would have closed, with no open session of its group to join, is late;
// one that joins an open session is not, however far back it lies.
func TestLateEventsOfSessions(t *testing.T) {
	proc, st := statefulProcessor(t, sessionsSrc(`  grace = "1m"`), "sessions")
	_, errs := st.batch(t, proc, event("u1", 0, 1, "a"), event("u1", 17, 1, "b"), event("u1", 20, 1, "c"))
	noErrors(t, errs)
	// At the watermark 20m: [0, 5m) has closed (5m + 1m grace); [17m, 25m) is open.
	outs, errs := st.batch(t, proc,
		event("u1", 3, 1, "late"),    // [3m, 8m) + grace is past, and [0, 5m) has closed
		event("u2", 14, 1, "late"),   // u2 has no session, and [14m, 19m) + grace is past
		event("u1", 12.5, 1, "join"), // [12.5m, 17.5m) overlaps [17m, 25m)
		event("u2", 14.5, 1, "new"),  // [14.5m, 19.5m) + grace is not past
	)
	for i, late := range []bool{true, true, false, false} {
		if late != (errs[i] != nil) {
			t.Errorf("message %d: error %v, want late %v", i, errs[i], late)
		}
		if late && (!IsPermanent(errs[i]) || !strings.HasPrefix(errs[i].Error(), "late: ")) {
			t.Errorf("message %d: %v, want a permanent error that says late", i, errs[i])
		}
	}
	wantWindows(t, "the late events' batch", windows(t, outs, "n"), "")
	wantWindows(t, "at the end", windows(t, st.end(t, proc), "n", "first"),
		`u2 [14.5, 19.5) n=1 first="new"`+"\n"+`u1 [12.5, 25) n=3 first="join"`)
}

// max_keys bounds the groups with open windows of a partition: a third group's message is
// dead-lettered, saying why, while the two groups held go on; once a group's windows close, its
// place is free.
func TestAggregateMaxKeys(t *testing.T) {
	src := `
stage "per_minute" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  max_keys   = 2
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
` + sinkA
	proc, st := statefulProcessor(t, src, "per_minute")
	_, errs := st.batch(t, proc, event("a", 0, 1, ""), event("b", 0.1, 1, ""), event("c", 0.2, 1, ""), event("a", 0.3, 1, ""))
	if errs[0] != nil || errs[1] != nil || errs[3] != nil {
		t.Fatalf("the messages of the groups held: %v", errs)
	}
	want := "partition 2 of stage per_minute already holds max_keys = 2 keys"
	if errs[2] == nil || !IsPermanent(errs[2]) || errs[2].Error() != want {
		t.Fatalf("the third group's message: %v, want the permanent error %q", errs[2], want)
	}
	if n := st.keyCount(t); n != 2 {
		t.Fatalf("key count %d, want 2", n)
	}
	// The minute closes for a and b, but not before the batch's messages: c is refused once more.
	outs, errs := st.batch(t, proc, event("b", 1.5, 1, ""), event("c", 1.6, 1, ""))
	if errs[0] != nil || errs[1] == nil {
		t.Fatalf("b goes on, c is refused until the minute's timers fire: %v", errs)
	}
	wantWindows(t, "the closed minute", windows(t, outs, "n"), "a [0, 1) n=2\nb [0, 1) n=1")
	if n := st.keyCount(t); n != 1 {
		t.Fatalf("key count %d once a's window closed, want 1 (b's next minute)", n)
	}
	_, errs = st.batch(t, proc, event("c", 1.7, 1, ""), event("a", 1.8, 1, ""))
	if errs[0] != nil || errs[1] == nil {
		t.Fatalf("c takes the free place, and a is now the third group: %v", errs)
	}
	wantWindows(t, "at the end", windows(t, st.end(t, proc), "n"), "b [1, 2) n=1\nc [1, 2) n=1")
	if n := st.keyCount(t); n != 0 {
		t.Fatalf("key count %d once every window closed, want 0", n)
	}
}

// Hopping windows open several windows per event, and a group counts once however many it has.
func TestAggregateMaxKeysCountsGroupsNotWindows(t *testing.T) {
	src := `
stage "hops" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  max_keys   = 1
  window {
    type    = "hopping"
    size    = "3m"
    advance = "1m"
  }
  aggregate = { n = count() }
}
` + sinkA
	proc, st := statefulProcessor(t, src, "hops")
	_, errs := st.batch(t, proc, event("a", 0, 1, ""), event("a", 1, 1, ""), event("a", 2.5, 1, ""), event("b", 2.6, 1, ""))
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || errs[3] == nil {
		t.Fatalf("a's windows count as one key, b is the second: %v", errs)
	}
	if n := st.keyCount(t); n != 1 {
		t.Fatalf("key count %d, want 1", n)
	}
}

// The window block's durations fit its type; a mistake is reported at the attribute that makes it.
func TestWindowChecks(t *testing.T) {
	for _, tc := range []struct{ window, want, at string }{
		{`type = "session"`, "needs a gap", "window"},
		{`type = "session"` + "\n    gap = \"0s\"", "at least 1ms", `"0s"`},
		{`type = "session"` + "\n    gap = \"5m\"\n    size = \"1m\"", "has no size", `"1m"`},
		{`type = "session"` + "\n    gap = \"5m\"\n    advance = \"1m\"", "has no advance", `"1m"`},
		{`type = "tumbling"` + "\n    size = \"1m\"\n    gap = \"5m\"", "Only a session window has a gap", `"5m"`},
		{`type = "tumbling"`, "needs a size", "window"},
		{`type = "hopping"` + "\n    size = \"1m\"\n    advance = \"7s\"", "whole number of advances", `"7s"`},
	} {
		src := `
pipeline "t" {}
topic "in" {}
topic "out" {}
sink "out" {
  kind  = "stdout"
  input = topic.out
}
source "s" {
  kind   = "stdin"
  output = topic.in
}
stage "agg" {
  kind     = "aggregate"
  input    = topic.in
  output   = topic.out
  group_by = msg.k
  window {
    ` + tc.window + `
  }
  aggregate = { n = count() }
}
`
		cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{})
		}
		if len(diags) != 1 || !strings.Contains(diags[0].Detail, tc.want) || diags[0].Subject == nil {
			t.Errorf("window { %s }: %v, want one error saying %q", tc.window, diags, tc.want)
			continue
		}
		r := diags[0].Subject
		if got := src[r.Start.Byte:r.End.Byte]; !strings.HasPrefix(got, tc.at) {
			t.Errorf("window { %s }: the error is at %q, want %q", tc.window, got, tc.at)
		}
	}
	// Valid windows compile.
	plan(t, sessionsSrc(""))
}

// aggregateSrc is an aggregate of msg.amount per user over the given window, with grace and late.
func aggregateSrc(window, grace, late string) string {
	return `
stage "agg" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  grace      = "` + grace + `"
  late       = ` + late + `
  window {
    ` + window + `
  }
  aggregate = { n = count(), total = sum(msg.amount) }
}
topic "late" {}
sink "late" {
  kind  = "stdout"
  input = topic.late
}
` + sinkA
}

// A window closes when the watermark reaches its end plus grace, not only once it has passed it:
// at the watermark 1m10s, [0, 1m) with a grace of 10s has closed, and an event for it is late, in
// the batch that moved the watermark there as in a later one.
func TestAWindowClosesWhenTheWatermarkReachesItsEndPlusGrace(t *testing.T) {
	proc, st := statefulProcessor(t, aggregateSrc(`type = "tumbling"`+"\n    size = \"1m\"", "10s", `"dead_letter"`), "agg")
	outs, errs := st.batch(t, proc, event("u", 0.5, 1, ""), event("u", 1+10.0/60, 2, ""), event("u", 59.0/60, 4, ""))
	if errs[0] != nil || errs[1] != nil || !IsPermanent(errs[2]) || !strings.HasPrefix(errs[2].Error(), "late: ") {
		t.Fatalf("errors %v: want the third late", errs)
	}
	wantWindows(t, "the batch", windows(t, outs, "n", "total"), "u [0, 1) n=1 total=1")
	_, errs = st.batch(t, proc, event("u", 0.9, 8, ""))
	if !IsPermanent(errs[0]) {
		t.Fatalf("an event for the closed window in a later batch: %v, want late", errs[0])
	}
	wantWindows(t, "at the end", windows(t, st.end(t, proc), "n", "total"), "u [1, 2) n=1 total=2")
	if st.late != 2 {
		t.Errorf("%d recorded late, want 2", st.late)
	}
}

// A session closes when the watermark reaches its end plus grace: an event that falls before the
// end of a closed session is late, whether its timer has fired (a later batch) or not (the same
// batch), and the closed session emits once.
func TestASessionClosesWhenTheWatermarkReachesItsEndPlusGrace(t *testing.T) {
	for _, sameBatch := range []bool{true, false} {
		proc, st := statefulProcessor(t, aggregateSrc(`type = "session"`+"\n    gap = \"5m\"", "0s", `"dead_letter"`), "agg")
		first := []string{event("u", 0, 1, ""), event("v", 5, 2, "")} // v moves the watermark to u's session's end, 5m
		late := event("u", 4, 4, "")
		var outs []Output
		var errs []error
		if sameBatch {
			outs, errs = st.batch(t, proc, append(first, late)...)
			errs = errs[2:]
		} else {
			outs, _ = st.batch(t, proc, first...)
			var more []Output
			more, errs = st.batch(t, proc, late)
			outs = append(outs, more...)
		}
		if !IsPermanent(errs[0]) || !strings.HasPrefix(errs[0].Error(), "late: ") {
			t.Fatalf("same batch %v: an event before a closed session's end: %v, want late", sameBatch, errs[0])
		}
		wantWindows(t, "the closed session", windows(t, outs, "n", "total"), "u [0, 5) n=1 total=1")
		wantWindows(t, "at the end", windows(t, st.end(t, proc), "n", "total"), "v [5, 10) n=1 total=2")
	}
}

// An event that is late for some of its hopping windows and on time for others counts in those
// still open, counts as late, and goes where late says for the others: to the late topic, or, when
// late = "dead_letter", to the dead letters while the attempt succeeds.
func TestAnEventLateForSomeOfItsWindows(t *testing.T) {
	hopping := `type    = "hopping"` + "\n    size    = \"3m\"\n    advance = \"1m\""
	for _, late := range []string{"topic.late", `"dead_letter"`, `"drop"`} {
		t.Run(late, func(t *testing.T) {
			proc, st := statefulProcessor(t, aggregateSrc(hopping, "0s", late), "agg")
			// At the watermark 3m, [0, 3m) has closed; an event at 2m30 belongs to it and to
			// [1m, 4m) and [2m, 5m), which are open.
			_, errs := st.batch(t, proc, event("u", 0.5, 1, ""), event("u", 3, 2, ""))
			noErrors(t, errs)
			outs, errs := st.batch(t, proc, event("u", 2.5, 4, ""))
			noErrors(t, errs)
			var routed []Output
			for _, o := range outs {
				if o.Topic == nil || o.Topic.Name == "late" {
					routed = append(routed, o)
				}
			}
			switch late {
			case "topic.late":
				if len(routed) != 1 || routed[0].Topic == nil || routed[0].DeadLetter != "" {
					t.Fatalf("outputs %+v: want the event on the late topic", outs)
				}
			case `"dead_letter"`:
				if len(routed) != 1 || !strings.Contains(routed[0].DeadLetter, "late: ") || !strings.Contains(routed[0].DeadLetter, "it counts in its others") {
					t.Fatalf("outputs %+v: want the event dead-lettered for [0, 3m)", outs)
				}
			case `"drop"`:
				if len(routed) != 0 {
					t.Fatalf("outputs %+v: want nothing routed", outs)
				}
			}
			if st.late != 1 {
				t.Errorf("%d recorded late, want 1", st.late)
			}
			wantWindows(t, "at the end", windows(t, st.end(t, proc), "n", "total"),
				"u [1, 4) n=2 total=6\nu [2, 5) n=2 total=6\nu [3, 6) n=1 total=2")
		})
	}
}

// Every aggregate function that the language accepts is one entry of the kind's table, and the
// table has no entry the language does not accept.
func TestAggregateFunctionsAreTheLanguages(t *testing.T) {
	for name := range flow.AggregateFuncs {
		if fn, ok := aggregateFunctions[name]; !ok || fn.add == nil || fn.merge == nil || fn.value == nil {
			t.Errorf("the language's aggregate function %s() has no add, merge and value in aggregateFunctions", name)
		}
	}
	for name := range aggregateFunctions {
		if _, ok := flow.AggregateFuncs[name]; !ok {
			t.Errorf("aggregateFunctions has %s(), which the language does not accept (flow.AggregateFuncs)", name)
		}
	}
}
