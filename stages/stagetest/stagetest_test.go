package stagetest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/stages"
	"github.com/flowrun/flowrun/stages/stagetest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// counter counts messages per key and emits the count when its key's timer fires, a minute after
// the watermark of its latest message; a message with
// "fail" fails after writing, and one with "permanent" sets a timer whose OnTimer fails for good.
var counter = stages.StatefulFunc{
	Process: func(ctx context.Context, m stages.Message, st stages.State) ([]stages.Message, error) {
		v, _, _ := st.Get(ctx, m.Key)
		if err := st.Put(ctx, m.Key, append(v, 'x')); err != nil {
			return nil, err
		}
		name := m.Key
		if m.Value["permanent"] != nil {
			name = "permanent"
		}
		wm, _ := st.Watermark(ctx)
		if err := st.SetTimer(ctx, name, wm.Add(time.Minute)); err != nil {
			return nil, err
		}
		if m.Value["fail"] != nil {
			return nil, errors.New("failed")
		}
		return nil, nil
	},
	OnTimer: func(ctx context.Context, name string, _ time.Time, st stages.State) ([]stages.Message, error) {
		if name == "permanent" {
			return nil, stages.Permanent(errors.New("never"))
		}
		v, _, _ := st.Get(ctx, name)
		return []stages.Message{{Key: name, Value: map[string]any{"count": len(v)}}}, nil
	},
	FireAtEnd: true,
}

func TestStateProcessesAndFiresAsTheRuntimeDoes(t *testing.T) {
	ctx := context.Background()
	st := stagetest.NewState()
	for _, p := range []string{`{}`, `{}`} {
		if out, err := st.Process(ctx, counter, stagetest.JSON(t, "a", p), t0); err != nil || len(out) != 0 {
			t.Fatalf("process: %v %v", out, err)
		}
	}
	// A failed call leaves nothing behind: neither its write nor its timer.
	if _, err := st.Process(ctx, counter, stagetest.JSON(t, "b", `{"fail":true}`), t0); err == nil {
		t.Fatal("the failing message did not fail")
	}
	if _, ok := st.Values()["b"]; ok || len(st.Timers()) != 1 {
		t.Fatalf("a failed call left state %q and timers %v", st.Values(), st.Timers())
	}
	// A permanent error of OnTimer drops its timer; the other fires with the watermark.
	if _, err := st.Process(ctx, counter, stagetest.JSON(t, "c", `{"permanent":true}`), t0); err != nil {
		t.Fatal(err)
	}
	out, err := st.AdvanceTo(ctx, counter, t0.Add(time.Minute))
	if err != nil || len(out) != 1 || out[0].Key != "a" || out[0].Value["count"] != 2 {
		t.Fatalf("timers at the watermark: %v %v", out, err)
	}
	if len(st.Timers()) != 0 {
		t.Fatalf("timers left: %v", st.Timers())
	}
	if wm, _ := st.Watermark(ctx); !wm.Equal(t0.Add(time.Minute)) {
		t.Fatalf("watermark %v", wm)
	}
	// End fires timers whatever their time, for FireAtEnd functions only.
	if out, err := st.Process(ctx, counter, stagetest.JSON(t, "d", `{}`), t0); err != nil || len(out) != 0 {
		t.Fatalf("a message of an earlier time than the watermark: %v %v", out, err) // its timer is a minute after the watermark
	}
	if out, err := st.End(ctx, counter); err != nil || len(out) != 1 || out[0].Key != "d" {
		t.Fatalf("end: %v %v, want d's count", out, err)
	}
	noEnd := counter
	noEnd.FireAtEnd = false
	if _, err := st.End(ctx, noEnd); err == nil || !strings.Contains(err.Error(), "FireAtEnd") {
		t.Fatalf("End of a function without FireAtEnd: %v", err)
	}
	// A function without OnTimer cannot set timers.
	noTimers := counter
	noTimers.OnTimer = nil
	if _, err := st.Process(ctx, noTimers, stagetest.JSON(t, "e", `{}`), t0); !stages.IsPermanent(err) {
		t.Fatalf("a timer set without OnTimer: %v, want a permanent error", err)
	}
}
