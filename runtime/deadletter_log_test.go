package runtime

import (
	"bytes"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestDeadLetterLogLimitsEachNode feeds dead letters of two nodes on a clock of its own: each node
// logs its first five of an interval one by one, with what and why, and the rest as one line when
// the interval is over, with the command that lists them.
func TestDeadLetterLogLimitsEachNode(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	lines := func() []string {
		defer buf.Reset()
		return strings.Split(strings.TrimSpace(buf.String()), "\n")
	}
	var l deadLetterLog
	check, out := &node{name: "check", typ: "stage"}, &node{name: "out", typ: "sink"}
	const path = "my pipelines/orders.hcl"
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	for i := 0; i < 8; i++ {
		env := &Envelope{Partition: i % 2, Key: fmt.Sprintf("k%d", i), ID: fmt.Sprintf("%d-0", i), Attempts: 3}
		l.record(log, check, env, fmt.Sprintf("reason %d", i%4), path, at(time.Duration(i)*100*time.Millisecond))
	}
	l.record(log, out, &Envelope{Key: "x", Attempts: 1}, "refused", path, at(time.Second))
	l.flush(log, path, at(5*time.Second), false) // no interval is over yet
	got := lines()
	if len(got) != 6 {
		t.Fatalf("%d lines, want 5 of check and 1 of out:\n%s", len(got), strings.Join(got, "\n"))
	}
	if want := `level=WARN msg="message dead-lettered" node=check node_type=stage partition=1 key=k1 id=1-0 attempts=3 reason="reason 1"`; got[1] != want {
		t.Errorf("line 2:\n%s\nwant\n%s", got[1], want)
	}
	if !strings.Contains(got[5], "node=out") {
		t.Errorf("out's dead letter is not logged: %s", got[5])
	}

	l.flush(log, path, at(10*time.Second), false)
	got = lines()
	want := `level=WARN msg="3 more dead letters from stage check in the last 10s; flowrun dlq list 'my pipelines/orders.hcl' --stage check" ` +
		`node=check node_type=stage dead_letters=3 list="flowrun dlq list 'my pipelines/orders.hcl' --stage check"`
	if len(got) != 1 || got[0] != want {
		t.Fatalf("after the interval:\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}

	// A new interval logs one by one again. Its held-back dead letters are counted before the next
	// interval's first line even when no flush came in between, and at the end of the run.
	for i := 0; i < 7; i++ {
		l.record(log, check, &Envelope{}, "reason 0", path, at(11*time.Second))
	}
	l.record(log, check, &Envelope{}, "reason 9", path, at(22*time.Second))
	got = lines()
	if len(got) != 7 || !strings.Contains(got[5], `msg="2 more dead letters from stage check in the last 12s;`) ||
		!strings.Contains(got[6], `reason="reason 9"`) {
		t.Fatalf("the next intervals:\n%s", strings.Join(got, "\n"))
	}
	for i := 0; i < 5; i++ {
		l.record(log, check, &Envelope{}, "reason 9", path, at(23*time.Second))
	}
	buf.Reset()
	l.flush(log, path, at(24*time.Second), true)
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], `msg="1 more dead letter from stage check in the last 2s;`) {
		t.Fatalf("the run's end: %s", strings.Join(got, "\n"))
	}

	wantReasons := []DeadLetterReason{{"reason 0", 9}, {"reason 1", 2}, {"reason 2", 2}}
	if got := l.reasons("check"); !reflect.DeepEqual(got, wantReasons) {
		t.Errorf("check's reasons %v, want %v (the first three distinct ones)", got, wantReasons)
	}
	if got := l.reasons("out"); !reflect.DeepEqual(got, []DeadLetterReason{{"refused", 1}}) {
		t.Errorf("out's reasons %v", got)
	}
	// The latest five of check, newest first: the five recorded at 23s, not the one at 22s.
	wantLatest := []RecentDeadLetter{{at(23 * time.Second), "reason 9"}, {at(23 * time.Second), "reason 9"},
		{at(23 * time.Second), "reason 9"}, {at(23 * time.Second), "reason 9"}, {at(23 * time.Second), "reason 9"}}
	if got := l.latest("check"); !reflect.DeepEqual(got, wantLatest) {
		t.Errorf("check's latest dead letters %v, want %v", got, wantLatest)
	}
	l.record(log, out, &Envelope{}, "gone", path, at(30*time.Second))
	if got, want := l.latest("out"), []RecentDeadLetter{{at(30 * time.Second), "gone"}, {at(time.Second), "refused"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("out's latest dead letters %v, want %v", got, want)
	}
	if got := l.latest("nobody"); got != nil {
		t.Errorf("a node without dead letters has latest %v", got)
	}
}

func TestDeadLetterCommandQuotesThePath(t *testing.T) {
	for path, want := range map[string]string{
		"examples/pipelines/retries": "flowrun dlq list examples/pipelines/retries --stage s",
		"my dir/p.hcl":               "flowrun dlq list 'my dir/p.hcl' --stage s",
		"it's.hcl":                   `flowrun dlq list 'it'\''s.hcl' --stage s`,
		"":                           "flowrun dlq list PATH --stage s",
	} {
		if got := DeadLetterCommand(path, "s"); got != want {
			t.Errorf("%q: %s, want %s", path, got, want)
		}
	}
}
