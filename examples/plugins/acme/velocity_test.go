package acme_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flowrun/examples/plugins/acme"
	"github.com/flowrun/flowrun/stages"
	"github.com/flowrun/flowrun/stages/stagetest"
)

// A unit test of a stateful function with stagetest's State, in memory: the second order of a
// customer within ten minutes passes, and the customer is forgotten ten minutes after their latest
// order, once the watermark gets there.
func TestVelocity(t *testing.T) {
	ctx := context.Background()
	fn := stages.StatefulFunc{Process: acme.Velocity, OnTimer: acme.ForgetCustomer}
	state := stagetest.NewState()
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	order := func(id string, at time.Time) []stages.Message {
		t.Helper()
		m := stagetest.JSON(t, "alice", `{"id":`+id+`}`)
		m.EntryTime = at // the stage has no event_time: an order's event time is its entry's
		out, err := state.Process(ctx, fn, m, at)
		if err != nil {
			t.Fatalf("order %s: %v", id, err)
		}
		return out
	}
	if out := order("1", start); len(out) != 0 {
		t.Fatalf("a customer's first order passed: %v", out)
	}
	out := order("2", start.Add(3*time.Minute))
	if len(out) != 1 || out[0].Value["recent_orders"] != 2 {
		t.Fatalf("the second order within ten minutes: %v, want it with recent_orders 2", out)
	}
	if got := state.Timers()["alice"]; !got.Equal(start.Add(13 * time.Minute)) {
		t.Fatalf("alice is forgotten at %v, want ten minutes after her latest order", got)
	}
	if _, err := state.AdvanceTo(ctx, fn, start.Add(13*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if len(state.Values()) != 0 || len(state.Timers()) != 0 {
		t.Fatalf("after ten quiet minutes the state holds %v and timers %v", state.Values(), state.Timers())
	}
	if out := order("3", start.Add(14*time.Minute)); len(out) != 0 {
		t.Fatalf("the first order after a quiet spell passed: %v", out)
	}
}

// A unit test of a sink kind with stagetest's Env: the sink is made from its block as a pipeline
// declares it, and writes the header and a row per message once flushed.
func TestCSVSink(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "review.csv")
	plan := stagetest.Compile(t, `
pipeline "p" {}
topic "risky" {}
sink "review_sheet" {
  kind    = "acme_csv"
  input   = topic.risky
  path    = "`+path+`"
  columns = ["id", "risk"]
}`)
	sink := stagetest.Sink(t, plan, "review_sheet", stagetest.Env(t, nil))
	for _, payload := range []string{`{"id":2,"risk":100}`, `{"id":3}`} {
		m := stagetest.JSON(t, "", payload)
		if _, err := sink.Deliver(ctx, &m, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.(stages.Flusher).Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if want := "id,risk\n2,100\n3,\n"; err != nil || string(got) != want {
		t.Fatalf("the sheet (%v):\n%s\nwant:\n%s", err, got, want)
	}
}
