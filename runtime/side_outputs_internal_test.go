package runtime

import (
	"path/filepath"
	"testing"

	"github.com/flowrun/flowrun/flow"
)

// TestSideOutputsAreWritten: a topic that a stage writes only through a side output (an
// aggregate's late route, a dedupe's duplicates) is written by the pipeline, so that its readers
// continue their messages' traces instead of starting new ones; and a stage whose late topic
// caps its lag reads no more at a time than the cap.
func TestSideOutputsAreWritten(t *testing.T) {
	plan, _, diags := flow.Build(filepath.Join("..", "flow", "testdata", "routes"), flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	written := plan.WrittenTopics()
	for topic, want := range map[string]bool{
		"late_clicks": true, "duplicate_clicks": true, "failed": true, "per_minute": true, "once.out": true,
		"clicks": false, // what comes from outside the pipeline
	} {
		if written[topic] != want {
			t.Errorf("topic %s written: %v, want %v", topic, written[topic], want)
		}
	}
	limits := cappedReads(plan)
	if got := limits["stage.per_minute"]; got != 100 {
		t.Errorf("per_minute reads %d at a time, want the late topic's max_lag, 100 (%v)", got, limits)
	}
	if len(limits) != 1 {
		t.Errorf("capped reads %v, want only per_minute's", limits)
	}
}
