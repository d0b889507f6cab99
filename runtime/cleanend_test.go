package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A job's log ends cleanly, and so does a stop: nothing fails after the work is done, or because
// the run stops while a batch is at work.

func init() {
	// test.slow_timer sets a timer a minute after each message's event time; the timer emits
	// what fired, after it waited for the run's gate when the run has one.
	stages.RegisterStateful("test.slow_timer", stages.StatefulFunc{
		Process: func(ctx context.Context, m stages.Message, state stages.State) ([]stages.Message, error) {
			at, err := time.Parse(time.RFC3339, fmt.Sprint(m.Value["at"]))
			if err != nil {
				return nil, stages.Permanent(err)
			}
			return nil, state.SetTimer(ctx, fmt.Sprint(m.Value["run"], "|", m.Value["id"]), at.Add(time.Minute))
		},
		OnTimer: func(ctx context.Context, timer string, _ time.Time, _ stages.State) ([]stages.Message, error) {
			run, id, _ := strings.Cut(timer, "|")
			if v, ok := gates.Load(run); ok {
				g := v.(*gate)
				g.once.Do(func() { close(g.entered) })
				<-g.open // whatever the context says: the test stops the run meanwhile
			}
			return []stages.Message{{Value: map[string]any{"fired": id}}}, nil
		},
	})
}

// endOfWork is the line a job logs once all its work is done.
const endOfWork = `msg="all work done"`

// checkEndsCleanly fails a test whose job logged a warning or an error after all its work was done
// (the dead letters held back by the rate limit are logged before, and nothing fires afterwards).
func checkEndsCleanly(t *testing.T, log string) {
	t.Helper()
	_, after, done := strings.Cut(log, endOfWork)
	if !done {
		return // the job ended otherwise (an error): what it logged is the test's to check
	}
	for _, line := range strings.Split(after, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("logged after all work was done: %s", line)
		}
	}
}

// TestStopWhileATimerFires stops a service while a stateful stage's timer fires: the batch that
// fires it was read, so it is processed and committed within the drain time, the rest of its
// timers read from Redis too, and nothing is logged as failed (it was: "firing the due timers
// failed ... context canceled", the timers read with the worker's context, which the stop ends).
// A job's end is tested in every runJob (checkEndsCleanly).
func TestStopWhileATimerFires(t *testing.T) {
	c := server.open(t)
	plan := buildSource(t, `
pipeline "timers" {}
topic "in" {
  partitions = 1
  key        = msg.k
}
stage "slow" {
  kind       = "go"
  func       = "test.slow_timer"
  input      = topic.in
  event_time = msg.at
}
sink "out" {
  kind  = "stdout"
  input = stage.slow
}
`)
	run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
	g := newGate(t, run)
	var logs, stdout syncBuffer
	rt, err := runtime.New(plan, runtime.Options{Redis: c, Logger: newLogger(&logs), Stdout: &stdout, DrainTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() {
		_, err := rt.Run(ctx)
		done <- err
	}()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i, at := range []string{"2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"} { // the second fires the first's timer
		payload := fmt.Sprintf(`{"k":"a","id":"m%d","at":%q,"run":%q}`, i, at, run)
		if err := pub.Publish(context.Background(), "in", stages.NewMessage("", []byte(payload), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	g.waitEntered(t)
	stop()
	waitFor(t, "the run to stop reading", func() bool { return strings.Contains(logs.String(), `msg="stopping: reading nothing new`) })
	g.release()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	_, after, _ := strings.Cut(logs.String(), `msg="stopping: reading nothing new`)
	for _, line := range strings.Split(after, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("logged while stopping: %s", line)
		}
	}
	// The result is in the stage's output (the sink, stopped, may not have read it).
	recs, err := c.Read(context.Background(), redis.Keys{Prefix: plan.KeyPrefix}.Stream("slow.out", 0), "0", 10, 0)
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Payload), `"fired":"m0"`) {
		t.Errorf("the timer's result was not committed: %v %+v\n%s", err, recs, logs.String())
	}
	if s := rt.Snapshot().Nodes[0]; s.In != 2 || s.Filtered != 2 || s.Written != 1 {
		t.Errorf("slow: %+v, want 2 in, filtered (they wait for their timers), 1 written", s)
	}
}
