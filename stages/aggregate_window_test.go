package stages

import (
	"encoding/json"
	"math"
	"testing"
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
