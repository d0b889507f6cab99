package runtime

import (
	"reflect"
	"testing"
	"time"
)

// TestHistoryKeepsFifteenMinutes feeds the history a sample a second for 20 minutes: it keeps a
// point every 10 seconds, the last 90, each with the rate over the step before it and the lag as
// given, -1 where none was.
func TestHistoryKeepsFifteenMinutes(t *testing.T) {
	var h history
	t0 := time.Unix(1000, 0)
	if got := h.snapshot([]string{"a"}); len(got.Times) != 0 || len(got.Nodes["a"].Rate) != 0 {
		t.Fatalf("a new history has points: %+v", got)
	}
	for s := 0; s <= 1200; s++ {
		in := map[string]int64{"a": int64(3 * s), "b": int64(s / 10 * 10)}
		lags := map[string]int64{"a": int64(s)}
		if s >= 600 {
			delete(lags, "a") // its polls fail from then on
		}
		h.add(t0.Add(time.Duration(s)*time.Second), in, lags)
	}
	got := h.snapshot([]string{"a", "b"})
	if got.Step != 10*time.Second || len(got.Times) != 90 {
		t.Fatalf("step %s, %d points; want 10s and 90", got.Step, len(got.Times))
	}
	if first, last := got.Times[0], got.Times[89]; !first.Equal(t0.Add(310*time.Second)) || !last.Equal(t0.Add(1200*time.Second)) {
		t.Errorf("points from %s to %s; want the last 15 minutes, 310s to 1200s after the start", first.Sub(t0), last.Sub(t0))
	}
	a, b := got.Nodes["a"], got.Nodes["b"]
	for i := range got.Times {
		if a.Rate[i] != 3 || b.Rate[i] != 1 {
			t.Fatalf("point %d: rates %v and %v, want 3 and 1", i, a.Rate[i], b.Rate[i])
		}
	}
	wantLag := make([]int64, 90)
	for i := range wantLag {
		wantLag[i] = -1
		if at := 310 + 10*i; at < 600 {
			wantLag[i] = int64(at)
		}
	}
	if !reflect.DeepEqual(a.Lag, wantLag) {
		t.Errorf("a's lags %v, want %v", a.Lag, wantLag)
	}
}
