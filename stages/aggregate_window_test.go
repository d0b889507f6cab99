package stages

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestWindowStateEncodesAsJSON: a window's state, encoded by hand, is what encoding/json makes of
// it (the state already in Redis was written so, and is read back with encoding/json), and a value
// that JSON cannot hold fails as it does.
func TestWindowStateEncodesAsJSON(t *testing.T) {
	windows := []*windowState{
		{Group: "k0421", Start: 1764478823000, End: 1764478824000, Fields: []accumulator{{N: 5}, {N: 5, Sum: 12345}}},
		{Group: "caf\u00e9 \"quoted\"\n\\", Start: -60000, End: 0, Fields: []accumulator{{}, {Sum: 1.5}, {Sum: 1e21}, {Sum: -2.5e-7}}},
		{Group: "", Fields: nil},
		{Group: "all", Fields: []accumulator{
			{Best: json.Number("12.50"), Set: true},
			{Best: "b", Set: true},
			{Distinct: map[string]bool{`"a"`: true, `1`: true}},
			{Counts: map[string]int64{`"x"`: 3, `"y"`: 1}},
			{Value: map[string]any{"z": []any{json.Number("1"), nil, true, "s"}, "a": 2.25}, At: 1764478823321, Set: true},
			{Value: nil, By: 3.0, Set: true},
			{Value: "v", By: "\u2028", Set: true, At: -1},
		}},
	}
	for i, w := range windows {
		got, err := w.appendJSON(nil)
		if err != nil {
			t.Fatalf("window %d: %v", i, err)
		}
		want, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("window %d:\ngot  %s\nwant %s", i, got, want)
		}
	}
	for _, bad := range []accumulator{{Sum: math.Inf(1)}, {Best: math.NaN(), Set: true}} {
		w := &windowState{Group: "g", Fields: []accumulator{bad}}
		if _, err := w.appendJSON(nil); err == nil {
			t.Errorf("%+v encoded, want the error encoding/json gives", bad)
		}
	}
}

// groupingState is a memState that shares timers as the runtime's State does (TimerGrouper): it
// keeps the members added, for the test to name their timers.
type groupingState struct {
	*memState
	members map[string][]string // by prefix and time, "w:60000"
}

func (s *groupingState) AddTimerMember(_ context.Context, prefix string, at time.Time, member string) error {
	group := prefix + strconv.FormatInt(at.UnixMilli(), 10)
	s.members[group] = append(s.members[group], member)
	return nil
}

// A timer that windows closing at the same time share (TimerGroupName, which a later version may
// write) closes them all: a, b and c open [0, 1m) in the first batch, each with a timer of its
// own; replaced by one that the three share, it emits them, once the second batch moves the
// watermark to 1m, and forgets them, groups and all.
func TestATimerThatWindowsShareClosesThemAll(t *testing.T) {
	proc, st := statefulProcessor(t, aggregateSrc(`type = "tumbling"`+"\n    size = \"1m\"", "0s", `"dead_letter"`), "agg")
	outs, errs := st.batch(t, proc, event("b", 0.1, 1, ""), event("a", 0.2, 2, ""), event("c", 0.3, 4, ""), event("a", 0.4, 8, ""))
	noErrors(t, errs)
	due := epoch.Add(time.Minute).UnixMilli()
	var members []string
	for _, g := range []string{"a", "b", "c"} {
		name := windowName(g, epoch.UnixMilli())
		if st.timers[name] != due {
			t.Fatalf("the first batch: timers %v; want one per window, due at 1m", st.timers)
		}
		delete(st.timers, name)
		members = append(members, keyOf(name))
	}
	if len(outs) != 0 || len(st.timers) != 0 {
		t.Fatalf("the first batch: outputs %v, timers %v; want none but the windows'", outs, st.timers)
	}
	st.timers[TimerGroupName(windowPrefix, due, members)] = due
	outs, errs = st.batch(t, proc, event("a", 1, 16, ""))
	noErrors(t, errs)
	wantWindows(t, "the shared timer", windows(t, outs, "n", "total"), "a [0, 1) n=2 total=10\nb [0, 1) n=1 total=1\nc [0, 1) n=1 total=4")
	for key := range st.values {
		if key != windowName("a", epoch.Add(time.Minute).UnixMilli()) && key != groupPrefix+"a" && key != KeyCountKey {
			t.Errorf("the state still holds %q", key)
		}
	}
	if n := st.keyCount(t); n != 1 {
		t.Errorf("%d groups counted, want 1 (a's next window)", n)
	}
}

// TestGroupStateCodec: a group's index, encoded by hand, is what encoding/json makes of it, and
// reads back by hand as encoding/json reads it; JSON of another shape (written otherwise, or
// changed by hand) is left to encoding/json.
func TestGroupStateCodec(t *testing.T) {
	groups := []*groupState{
		{Windows: []openWindow{{ID: 1764478800000, Start: 1764478800000, End: 1764478860000}}},
		{Windows: []openWindow{{ID: -60000, Start: -60000, End: 0}, {ID: 0, Start: 0, End: 60000}}},
		{Next: 3, Windows: []openWindow{{ID: 2, Start: 5, End: 9}}, ClosedUntil: 4},
		{Next: 7, Windows: []openWindow{}, ClosedUntil: -1},
		{},
	}
	for i, g := range groups {
		got := g.appendJSON(nil)
		want, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("group %d:\ngot  %s\nwant %s", i, got, want)
		}
		var decoded groupState
		if err := json.Unmarshal(want, &decoded); err != nil {
			t.Fatal(err)
		}
		parsed, ok := parseGroupState(want)
		if !ok || !reflect.DeepEqual(*parsed, decoded) {
			t.Errorf("group %d: %s parsed as %+v (%v), encoding/json reads %+v", i, want, parsed, ok, decoded)
		}
	}
	for _, other := range []string{
		`{"w": [{"i":1,"s":1,"e":2}]}`, `{"w":[{"s":1,"i":1,"e":2}]}`, `{"w":[{"i":1,"s":1,"e":2,"x":0}]}`,
		`{"w":[]} `, `{"w":[],"n":1}`, `{"w":[{"i":1.5,"s":1,"e":2}]}`, `{"w":[{"i":99999999999999999999,"s":1,"e":2}]}`, `{"w":[}`, ``,
	} {
		if g, ok := parseGroupState([]byte(other)); ok {
			t.Errorf("%s parsed by hand as %+v, want it left to encoding/json", other, g)
		}
	}
}

// Each window keeps a timer of its own, even where the state would share timers (TimerGrouper),
// effectively once or not: an earlier version takes a shared timer for none of its own (its
// windows would never be emitted), and an effectively-once stage names a timer's outputs by the
// timer, which a batch processed again may share out otherwise. a and b open [0, 1m) in one batch,
// each with its timer, which closes it.
func TestWindowsKeepTimersOfTheirOwn(t *testing.T) {
	for _, delivery := range []string{"at_least_once", "effectively_once"} {
		attrs := `"dead_letter"` + "\n  delivery   = \"" + delivery + "\""
		proc, st := statefulProcessor(t, aggregateSrc(`type = "tumbling"`+"\n    size = \"1m\"", "0s", attrs), "agg")
		grouping := &groupingState{memState: st, members: map[string][]string{}}
		st.self = grouping
		_, errs := st.batch(t, proc, event("a", 0.1, 1, ""), event("b", 0.2, 2, ""))
		noErrors(t, errs)
		due := epoch.Add(time.Minute).UnixMilli()
		want := map[string]int64{windowName("a", epoch.UnixMilli()): due, windowName("b", epoch.UnixMilli()): due}
		if len(grouping.members) != 0 || !maps.Equal(st.timers, want) {
			t.Fatalf("%s: timers %v, members %q; want a timer per window %v", delivery, st.timers, grouping.members, want)
		}
		outs, errs := st.batch(t, proc, event("a", 1, 4, ""))
		noErrors(t, errs)
		wantWindows(t, "their timers", windows(t, outs, "n", "total"), "a [0, 1) n=1 total=1\nb [0, 1) n=1 total=2")
	}
}

// TestDecodedCacheGivesOnlyWhatTheStateHolds: a value kept with the bytes written is taken back only
// with those same bytes and partition, once; the state changed since (another process, a failed
// attempt) or another partition's value of the name is decoded instead.
func TestDecodedCacheGivesOnlyWhatTheStateHolds(t *testing.T) {
	var c decodedCache[groupState]
	g := &groupState{Windows: []openWindow{{ID: 1, Start: 0, End: 10}}}
	raw := g.appendJSON(nil)
	c.keep(0, "\x00g:u", raw, g)
	if !c.holds("\x00g:u") {
		t.Fatal("the cache does not hold what it kept")
	}
	if got := c.take(0, "\x00g:u", append([]byte(nil), raw...)); got != g {
		t.Fatalf("the same bytes gave %v", got)
	}
	if got := c.take(0, "\x00g:u", raw); got != nil {
		t.Errorf("a value taken out was given again: %v", got)
	}

	c.keep(0, "\x00g:u", raw, g)
	changed := (&groupState{Windows: []openWindow{{ID: 2, Start: 10, End: 20}}}).appendJSON(nil)
	if got := c.take(0, "\x00g:u", changed); got != nil {
		t.Errorf("bytes the state holds since gave the kept value %v", got)
	}
	if got := c.take(0, "\x00g:u", raw); got != nil {
		t.Errorf("a value whose bytes differed once was kept: %v", got)
	}

	c.keep(1, "\x00g:u", raw, g)
	if got := c.take(0, "\x00g:u", raw); got != nil {
		t.Errorf("partition 1's value was given for partition 0: %v", got)
	}

	for i := range maxCachedValues + 1 {
		c.keep(0, strconv.Itoa(i), raw, g)
	}
	if n := len(c.values); n > maxCachedValues {
		t.Errorf("the cache holds %d values, past its bound of %d", n, maxCachedValues)
	}
}
