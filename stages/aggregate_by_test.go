package stages

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/flowrun/flowrun/flow"
)

// bySrc is an aggregate of max_by and min_by per user, in windows of the given block.
func bySrc(window string) string {
	return `
stage "by" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  grace      = "10m"
  window {
    ` + window + `
  }
  aggregate = {
    top    = max_by(msg.page, msg.amount)
    bottom = min_by(msg.page, msg.amount)
  }
}
` + sinkA
}

// max_by and min_by pick the VALUE of the message with the largest or smallest BY; on a tie in BY,
// the largest or smallest VALUE, whatever came first; a message without a BY does not count.
func TestMaxByAndMinBy(t *testing.T) {
	proc, st := statefulProcessor(t, bySrc(`type = "tumbling"`+"\n    size = \"10m\""), "by")
	noBy := `{"user":"u1","at":"2026-01-01T00:01:30Z","page":"z","amount":null}`
	for _, batch := range [][]string{
		{event("u1", 0, 5, "b"), event("u1", 1, 9, "c"), noBy, event("u1", 2, 1, "y")},
		{event("u1", 3, 9, "a"), event("u1", 4, 1, "x"), event("u2", 5, 7, "only")},
	} {
		_, errs := st.batch(t, proc, batch...)
		noErrors(t, errs)
	}
	wantWindows(t, "at the end", windows(t, st.end(t, proc), "top", "bottom"),
		`u1 [0, 10) top="c" bottom="x"`+"\n"+`u2 [0, 10) top="only" bottom="only"`)
}

// Sessions merged by an event that bridges them keep the best of both, as if one had seen every
// event.
func TestMaxByAcrossMergedSessions(t *testing.T) {
	proc, st := statefulProcessor(t, bySrc(`type = "session"`+"\n    gap = \"5m\""), "by")
	_, errs := st.batch(t, proc, event("u1", 0, 5, "a"), event("u1", 8, 1, "b"), event("u1", 10, 9, "c"))
	noErrors(t, errs)
	_, errs = st.batch(t, proc, event("u1", 4, 3, "d"))
	noErrors(t, errs)
	wantWindows(t, "at the end", windows(t, st.end(t, proc), "top", "bottom"), `u1 [0, 15) top="c" bottom="b"`)
}

// Whatever the order of the messages, and however their accumulators are merged (sessions), max_by
// and min_by give the same result: (BY, VALUE) is a total order. Values go through the state's JSON
// between steps at random, as a batch boundary does, and numbers come as the expression language
// gives them (json.Number) or as the state gives them back (float64).
func TestMaxByDoesNotDependOnOrder(t *testing.T) {
	values := []any{json.Number("1.0"), 1.0, json.Number("2"), "2", "10", "abc", "b", true, false, nil,
		map[string]any{"a": json.Number("1")}, []any{1.0, "x"}, "NaN"}
	r := rand.New(rand.NewPCG(1, 2))
	for _, name := range []string{"max_by", "min_by"} {
		fn := aggregateFunctions[name]
		var want string
		// The same multiset in many orders and merge trees.
		base := make([]byArgs, 40)
		for i := range base {
			base[i] = byArgs{value: values[r.IntN(len(values))], by: values[r.IntN(len(values))]}
		}
		for round := 0; round < 200; round++ {
			r.Shuffle(len(base), func(i, j int) { base[i], base[j] = base[j], base[i] })
			got := canonical(fn.value(foldRandomly(t, r, fn, base), flow.Aggregate{}))
			if round == 0 {
				want = got
			} else if got != want {
				t.Fatalf("%s: order %d gives %s, the first gave %s", name, round, got, want)
			}
		}
	}
}

// foldRandomly adds args into accumulators split at random points, reloads them from JSON at random,
// and merges them in a random order.
func foldRandomly(t *testing.T, r *rand.Rand, fn aggregateFunction, args []byArgs) *accumulator {
	t.Helper()
	var parts []*accumulator
	cur := &accumulator{}
	for _, a := range args {
		cur.add(fn, a, 0)
		if r.IntN(4) == 0 {
			cur = reloaded(t, cur)
		}
		if r.IntN(5) == 0 {
			parts = append(parts, cur)
			cur = &accumulator{}
		}
	}
	parts = append(parts, cur)
	for len(parts) > 1 {
		i, j := r.IntN(len(parts)), r.IntN(len(parts))
		if i == j {
			continue
		}
		fn.merge(parts[i], parts[j])
		parts[i] = reloaded(t, parts[i])
		parts = append(parts[:j], parts[j+1:]...)
	}
	return parts[0]
}

func reloaded(t *testing.T, a *accumulator) *accumulator {
	t.Helper()
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var out accumulator
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// compareValues is a total order: antisymmetric and transitive over values of every type, and equal
// only for values with the same JSON.
func TestCompareValuesIsATotalOrder(t *testing.T) {
	values := []any{json.Number("1.0"), 1.0, 2.0, json.Number("10"), "2", "10", "9a", "1a", "abc", "", true, false, nil,
		map[string]any{"a": 1.0}, []any{1.0}, "NaN", "Inf", -3.5}
	for _, a := range values {
		for _, b := range values {
			ab, ba := compareValues(a, b), compareValues(b, a)
			if ab != -ba {
				t.Errorf("compare(%#v, %#v) = %d but compare(%#v, %#v) = %d", a, b, ab, b, a, ba)
			}
			if ab == 0 && canonical(a) != canonical(b) {
				t.Errorf("%#v and %#v compare equal but differ", a, b)
			}
			for _, c := range values {
				if ab <= 0 && compareValues(b, c) <= 0 && compareValues(a, c) > 0 {
					t.Errorf("not transitive: %#v <= %#v <= %#v but %#v > %#v", a, b, c, a, c)
				}
			}
		}
	}
	if compareValues(2.0, "10") >= 0 || compareValues("10", "abc") >= 0 || compareValues("abc", "b") >= 0 {
		t.Error("numbers (and numeric strings) should come first by value, then other values by text")
	}
}

// State written before max_by and min_by existed reads back as it was: the accumulator's new field
// has a JSON name of its own.
func TestAccumulatorStateBeforeMaxBy(t *testing.T) {
	var a accumulator
	if err := json.Unmarshal([]byte(`{"n":2,"sum":3,"best":4,"d":{"\"x\"":true},"c":{"\"y\"":1},"v":"z","at":5,"set":true}`), &a); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%v %v %v %v %v %v %v %v %v", a.N, a.Sum, a.Best, a.Distinct, a.Counts, a.Value, a.At, a.Set, a.By); got != `2 3 4 map["x":true] map["y":1] z 5 true <nil>` {
		t.Errorf("old state decoded as %s", got)
	}
}
