package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
)

// test_window is a stateful stage kind of the tests: it counts the messages of each key per minute
// of event time (msg.at, Unix ms) and passes each message on with its window's start and the count
// so far. A message whose minute the partition's watermark has passed is late: recorded and
// dropped. A message with fail = N fails its first N attempts with an error that its retry policy
// retries (neither transient nor permanent).
func init() {
	stages.RegisterStage(stages.StageKind{
		Spec: &flow.Kind{
			Name: "test_window",
			Doc:  "Counts the messages of each key per minute of event time (a stateful stage of the tests).",
			Attributes: []flow.Attribute{{Name: "event_time", Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true,
				Doc: "The message's event time."}},
			Example: `stage "tally" {
  kind       = "test_window"
  input      = topic.in
  event_time = msg.at
}`,
		},
		Traits: stages.StageTraits{Stateful: true},
		NewStateful: func(s *flow.Stage, env stages.Env) (stages.StatefulStage, error) {
			return stages.StatefulStage{Processor: &windowStage{out: s.Output}}, nil
		},
	})
}

type windowStage struct {
	out *flow.Topic
}

// windowFailures counts the failed attempts at each message of test_window, by run and message.
var windowFailures = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

func (s *windowStage) Process(ctx context.Context, st stages.State, m *stages.Message, out []stages.Output) ([]stages.Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	number := func(field string) int64 { // numbers decode as json.Number
		n, _ := strconv.ParseInt(fmt.Sprint(m.Value[field]), 10, 64)
		return n
	}
	at := number("at")
	start := at / 60_000 * 60_000
	watermark, err := st.Watermark(ctx)
	if err != nil {
		return out, err
	}
	if fail := number("fail"); fail > 0 {
		id := fmt.Sprint(m.Value["run"], "/", m.Value["i"])
		windowFailures.Lock()
		failed := windowFailures.n[id]
		if failed < int(fail) {
			windowFailures.n[id]++
		}
		windowFailures.Unlock()
		if failed < int(fail) {
			return out, errors.New("failing on purpose")
		}
	}
	if start+60_000 <= watermark.UnixMilli() {
		st.Record(stages.Late)
		return out, nil
	}
	key := m.Key + "@" + strconv.FormatInt(start, 10)
	v, _, err := st.Get(ctx, key)
	if err != nil {
		return out, err
	}
	n, _ := strconv.Atoi(string(v))
	n++
	if err := st.Put(ctx, key, []byte(strconv.Itoa(n))); err != nil {
		return out, err
	}
	m.Value["window"], m.Value["count"] = start, n
	m.Changed()
	return append(out, stages.Output{Topic: s.out, Message: *m}), nil
}

// A stateful stage's failed message waits for its retries in place, however long its backoff, so
// that the partition, and with it the watermark, waits for it: the messages behind it cannot move
// the watermark past its window while it waits in a retry set, and it counts in its window once it
// succeeds instead of coming back late. Retries longer than RetryInPlaceUpTo (shortened here)
// would otherwise wait in Redis while later messages went on.
func TestStatefulRetriesWaitInPlace(t *testing.T) {
	t.Parallel()
	src := `
pipeline "retries" {}
variable "out" {}
retry "slow" {
  max_attempts = 5
  backoff      = "constant"
  initial      = "50ms"
  jitter       = 0
}
topic "in" {
  partitions = 1
  key        = msg.k
}
stage "tally" {
  kind       = "test_window"
  input      = topic.in
  event_time = msg.at
  retry      = retry.slow
}
sink "out" {
  kind  = "file"
  input = stage.tally
  path  = var.out
}
`
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			plan := buildSource(t, src, "out="+out)
			run := t.Name() + itoa(prefixes.Add(1))
			// Both are in the stream before the job starts, so that its first read takes both: the
			// first, at 10s of event time, fails twice; the second, five minutes later, would close
			// the first's window if it went first.
			pub, err := runtime.NewPublisher(c, plan)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for _, p := range []string{
				fmt.Sprintf(`{"k":"a","i":1,"at":10000,"fail":2,"run":%q}`, run),
				fmt.Sprintf(`{"k":"b","i":2,"at":310000,"run":%q}`, run),
			} {
				if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(p), nil)); err != nil {
					t.Fatal(err)
				}
			}
			if err := pub.Close(ctx); err != nil {
				t.Fatal(err)
			}

			j := runJob(t, c, plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
			if n := j.node(t, "tally"); n.FailedAttempts != 2 || n.Retries != 2 || n.Late != 0 || n.DeadLettered != 0 {
				t.Fatalf("tally: %+v, want 2 failed and 2 retried attempts, nothing late or dead-lettered\n%s", n, j.log)
			}
			got := jsonLines(t, readFile(t, out))
			if len(got) != 2 {
				t.Fatalf("%d messages out, want 2: %v", len(got), got)
			}
			for i, want := range []struct {
				k      string
				window float64
			}{{"a", 0}, {"b", 300000}} {
				if m := got[i]; m["k"] != want.k || m["window"] != want.window || m["count"] != 1.0 {
					t.Errorf("message %d: %v, want key %s counted once in the window at %v", i, m, want.k, want.window)
				}
			}
		})
	}
}
