package stages

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/aggregate_trace.golden instead of comparing with it")

// recordingState is a memState that writes down every change a kind makes to it, in order.
type recordingState struct {
	*memState
	log *strings.Builder
}

func (s recordingState) Put(ctx context.Context, key string, value []byte) error {
	fmt.Fprintf(s.log, "  put %q %s\n", key, value)
	return s.memState.Put(ctx, key, value)
}

func (s recordingState) Delete(ctx context.Context, key string) error {
	fmt.Fprintf(s.log, "  delete %q\n", key)
	return s.memState.Delete(ctx, key)
}

func (s recordingState) SetTimer(ctx context.Context, name string, at time.Time) error {
	fmt.Fprintf(s.log, "  timer %q %d\n", name, at.UnixMilli())
	return s.memState.SetTimer(ctx, name, at)
}

func (s recordingState) CancelTimer(ctx context.Context, name string) error {
	fmt.Fprintf(s.log, "  cancel %q\n", name)
	return s.memState.CancelTimer(ctx, name)
}

func (s recordingState) Hold(ctx context.Context, name string, at time.Time) error {
	fmt.Fprintf(s.log, "  hold %q %d\n", name, at.UnixMilli())
	return s.memState.Hold(ctx, name, at)
}

func (s recordingState) Release(ctx context.Context, name string) error {
	fmt.Fprintf(s.log, "  release %q\n", name)
	return s.memState.Release(ctx, name)
}

// traceEvent is a payload of user's at seconds past epoch, with raw JSON for its amount and page.
func traceEvent(user string, seconds int, amount, page string) string {
	at := epoch.Add(time.Duration(seconds) * time.Second).Format(time.RFC3339Nano)
	return fmt.Sprintf(`{"user":%q,"at":%q,"amount":%s,"page":%s}`, user, at, amount, page)
}

// everyFunction is an aggregate attribute with each aggregate function over the events' fields.
const everyFunction = `
  aggregate = {
    n       = count()
    total   = sum(msg.amount)
    low     = min(msg.amount)
    high    = max(msg.amount)
    mean    = avg(msg.amount)
    pages   = count_distinct(msg.page)
    top     = top_k(msg.page, 2)
    first   = first(msg.page)
    last    = last(msg.page)
    lowpage = min(msg.page)
    toppage = max(msg.page)
  }`

// The aggregate kind's state, timers, holds and results, byte for byte, over windows of each type
// and every aggregate function, with late events, merges and a restart: state written by one
// version of the kind must be read by the next, and a change of its encoding or results shows here.
// Halfway through each case a new processor takes the state over, as another process would, so
// that the state written before is decoded, not taken from the processor's cache.
func TestAggregateTraceIsUnchanged(t *testing.T) {
	cases := []struct{ name, window, extra string }{
		{"tumbling", `type = "tumbling"` + "\n    size = \"1m\"", `  grace = "30s"`},
		{"hopping", `type = "hopping"` + "\n    size = \"3m\"\n    advance = \"1m\"", `  emit = "on_update"` + "\n" + `  late = "drop"`},
		{"session", `type = "session"` + "\n    gap = \"5m\"", `  emit = "on_update"` + "\n" + `  grace = "1m"` + "\n  max_keys = 2"},
	}
	batches := [][]string{
		{
			traceEvent("u", 10, "3", `"home"`), traceEvent("u", 20, "1.5", `"cart"`), traceEvent("v", 30, `"7"`, `{"b":1,"a":[2,"x"]}`),
			traceEvent("u", 40, "null", `"home"`), traceEvent("w", 50, "12345678901234567890", "7"),
		},
		{
			traceEvent("u", 70, "-2", `"pay"`), traceEvent("v", 200, "true", "null"), traceEvent("u", 5, "9", `"late?"`),
			traceEvent("x", 400, "0.1", `"home"`),
		},
		{
			traceEvent("u", 390, "4", `"cart"`), traceEvent("u", 100, "2.25", `"home"`), traceEvent("v", 460, `"abc"`, `"b"`),
		},
		{
			traceEvent("u", 700, "1e3", `"home"`), traceEvent("v", 230, "5", `"a"`), traceEvent("w", 1000, "6", `"cart"`),
		},
	}
	var log strings.Builder
	for _, c := range cases {
		src := strings.Replace(aggregateTraceSrc(c.window), "@extra", c.extra, 1)
		fmt.Fprintf(&log, "# %s\n", c.name)
		proc, st := statefulProcessor(t, src, "agg")
		st.self = recordingState{st, &log}
		for i, batch := range batches {
			if i == len(batches)/2 {
				fmt.Fprintf(&log, "restart\n")
				proc, _ = statefulProcessor(t, src, "agg")
			}
			fmt.Fprintf(&log, "batch %d\n", i)
			outs, errs := st.batch(t, proc, batch...)
			writeTrace(t, &log, outs, errs)
		}
		fmt.Fprintf(&log, "end\n")
		writeTrace(t, &log, st.end(t, proc), nil)
		fmt.Fprintf(&log, "late %d, left %d values, %d timers, %d holds\n", st.late, len(st.values), len(st.timers), len(st.holds))
	}
	const golden = "testdata/aggregate_trace.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(log.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := log.String(); got != string(want) {
		t.Errorf("the aggregate's trace differs from %s (go test ./stages -run TestAggregateTraceIsUnchanged -update rewrites it):\n%s",
			golden, firstDifference(got, string(want)))
	}
}

func aggregateTraceSrc(window string) string {
	return `
stage "agg" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  window {
    ` + window + `
  }
@extra
` + everyFunction + `
}
` + sinkA
}

// writeTrace writes a batch's outputs and errors down.
func writeTrace(t *testing.T, log *strings.Builder, outs []Output, errs []error) {
	t.Helper()
	for _, o := range outs {
		topic := "-"
		if o.Topic != nil {
			topic = o.Topic.Name
		}
		headers := make([]string, 0, len(o.Message.Headers))
		for k, v := range o.Message.Headers {
			headers = append(headers, k+"="+v)
		}
		sort.Strings(headers)
		fmt.Fprintf(log, "  output %s key=%q headers=%v dead_letter=%q %s\n", topic, o.Message.Key, headers, o.DeadLetter, payloadOf(t, o))
	}
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(log, "  error %d: %v\n", i, err)
		}
	}
}

// firstDifference shows the first line where got and want differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\ngot  %s\nwant %s", i+1, gl, wl)
		}
	}
	return ""
}
