package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// totalFailed holds the messages whose first attempt test.running_total failed, by run and i.
var totalFailed sync.Map

func init() {
	// test.running_total keeps a total of msg.n per key in its state and passes each message on with
	// the total so far. Its first attempt at a message with fail = true fails after it wrote the new
	// total; at a message with hold = true it waits for the run's gate (newGate) first.
	stages.RegisterStateful("test.running_total", stages.StatefulFunc{
		Process: func(ctx context.Context, m stages.Message, state stages.State) ([]stages.Message, error) {
			run, i := fmt.Sprint(m.Value["run"]), fmt.Sprint(m.Value["i"])
			if v, ok := gates.Load(run); ok && m.Value["hold"] == true {
				g := v.(*gate)
				g.once.Do(func() { close(g.entered) })
				select {
				case <-g.open:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			v, _, err := state.Get(ctx, m.Key)
			if err != nil {
				return nil, err
			}
			total, _ := strconv.ParseInt(string(v), 10, 64)
			n, _ := m.Value["n"].(json.Number).Int64()
			total += n
			if err := state.Put(ctx, m.Key, []byte(strconv.FormatInt(total, 10))); err != nil {
				return nil, err
			}
			if m.Value["fail"] == true {
				if _, seen := totalFailed.LoadOrStore(run+"/"+i, true); !seen {
					return nil, errors.New("failing after the write")
				}
			}
			m.Value["total"] = total
			return []stages.Message{m}, nil
		},
	})
	// test.minutes counts the messages of each key per minute of event time (msg.at), and reports
	// each key's minute once the watermark has passed its end: its timer's OnTimer emits the count
	// and deletes it. A message for a minute that has ended is late. test.minutes_at_end does the
	// same, and fires every timer at the end of a job.
	minutes := stages.StatefulFunc{
		Process: func(ctx context.Context, m stages.Message, state stages.State) ([]stages.Message, error) {
			at, _ := m.Value["at"].(json.Number).Int64()
			end := at - at%60_000 + 60_000
			watermark, err := state.Watermark(ctx)
			if err != nil {
				return nil, err
			}
			if watermark.UnixMilli() >= end {
				state.Record(stages.Late)
				return nil, nil
			}
			key := m.Key + "@" + strconv.FormatInt(end, 10)
			v, _, err := state.Get(ctx, key)
			if err != nil {
				return nil, err
			}
			count, _ := strconv.Atoi(string(v))
			return nil, errors.Join(state.Put(ctx, key, []byte(strconv.Itoa(count+1))), state.SetTimer(ctx, key, time.UnixMilli(end)))
		},
		OnTimer: func(ctx context.Context, timer string, at time.Time, state stages.State) ([]stages.Message, error) {
			v, found, err := state.Get(ctx, timer)
			if err != nil || !found {
				return nil, err
			}
			count, _ := strconv.Atoi(string(v))
			key, _, _ := strings.Cut(timer, "@")
			out := stages.Message{Key: key, Value: map[string]any{"key": key, "end": at.UnixMilli(), "count": count}}
			return []stages.Message{out}, state.Delete(ctx, timer)
		},
	}
	stages.RegisterStateful("test.minutes", minutes)
	minutes.FireAtEnd = true
	stages.RegisterStateful("test.minutes_at_end", minutes)
}

// A stateful Go function's state is committed with its batch's acknowledgements, fenced by the
// partition's lease: a failed attempt's writes are dropped; the state of the first job is there for
// the next; and when a process loses the partition with a batch in hand, its state writes are
// refused with its acks, and the process that takes the partition over continues from the committed
// state, with nothing to restore. Every running total is exact, and every message arrives once.
func TestStatefulFunctionStateMovesWithTheLease(t *testing.T) {
	t.Parallel()
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
			g := newGate(t, run)
			plan := buildSource(t, `
pipeline "totals" {
  delivery = "effectively_once"
}
retry "fast" {
  max_attempts = 3
  initial      = "1ms"
  max          = "5ms"
}
topic "in" {
  partitions = 1
  key        = msg.key
}
topic "out" {}
stage "total" {
  kind   = "go"
  func   = "test.running_total"
  input  = topic.in
  output = topic.out
  retry  = retry.fast
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
`)
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			// Message i adds i to the total of key k<i mod 3>.
			keyOf := func(i int) string { return "k" + strconv.Itoa(i%3) }
			totalsUpTo := func(n int) (byKey map[string]int64, byMessage map[int]int64) {
				byKey, byMessage = map[string]int64{}, map[int]int64{}
				for i := 0; i < n; i++ {
					byKey[keyOf(i)] += int64(i)
					byMessage[i] = byKey[keyOf(i)]
				}
				return byKey, byMessage
			}
			publish := func(from, to int, extra func(i int) string) {
				pub, err := runtime.NewPublisher(c, plan)
				if err != nil {
					t.Fatal(err)
				}
				for i := from; i < to; i++ {
					msg := fmt.Sprintf(`{"run":%q,"key":%q,"i":%d,"n":%d%s}`, run, keyOf(i), i, i, extra(i))
					if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(msg), nil)); err != nil {
						t.Fatal(err)
					}
				}
				if err := pub.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// checkState checks that the committed state holds the totals of messages 0 to n-1.
			checkState := func(when string, n int) {
				t.Helper()
				state, err := c.Universal().HGetAll(ctx, keys.State("in", 0, "total")).Result()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := strconv.ParseInt(state[redis.WatermarkField], 10, 64); err != nil {
					t.Fatalf("%s: no watermark in the state: %q", when, state)
				}
				delete(state, redis.WatermarkField)
				want, _ := totalsUpTo(n)
				if len(state) != len(want) {
					t.Fatalf("%s: state %q, want the totals of messages 0 to %d, %v", when, state, n-1, want)
				}
				for k, total := range want {
					if state[k] != strconv.FormatInt(total, 10) {
						t.Fatalf("%s: state %q, want the totals of messages 0 to %d, %v", when, state, n-1, want)
					}
				}
			}

			// A first job: messages 0 to 9, of which 4 fails once after it wrote its total.
			publish(0, 10, func(i int) string { return map[bool]string{true: `,"fail":true`}[i == 4] })
			j := runJob(t, c, plan, runtime.Options{Nodes: []string{"total"}, ProcessID: "first"})
			if n := j.node(t, "total"); n.Out != 10 || n.FailedAttempts != 1 || n.Retries != 1 {
				t.Fatalf("total, first job: %+v", n)
			}
			checkState("after the first job", 10)

			// Process a reads messages 10 to 19 and holds the batch at message 10 while its lease
			// is taken from it: it commits nothing of the batch.
			publish(10, 20, func(i int) string { return map[bool]string{true: `,"hold":true`}[i == 10] })
			leaseKey := keys.Lease("in", 0, "total")
			aCtx, stopA := context.WithCancel(ctx)
			var logA syncBuffer
			aDone := make(chan error, 1)
			go func() {
				_, err := runtime.Run(aCtx, plan, runtime.Options{Redis: c, Nodes: []string{"total"}, ProcessID: "a",
					LeaseTTL: time.Hour, Logger: newLogger(&logA)})
				aDone <- err
			}()
			g.waitEntered(t)
			rdb := c.Universal()
			if err := rdb.Del(ctx, leaseKey).Err(); err != nil {
				t.Fatal(err)
			}
			thief, ok, err := c.AcquireLease(ctx, leaseKey, "thief", time.Hour)
			if err != nil || !ok {
				t.Fatalf("taking the lease: %v, %v", ok, err)
			}
			g.release()
			waitFor(t, "process a to find its lease lost", func() bool {
				return strings.Contains(logA.String(), "lost the partition to another process")
			})
			stopA()
			if err := <-aDone; err != nil {
				t.Fatal(err)
			}
			checkState("after process a lost the partition", 10)

			// Process b takes the partition over and processes the batch again from that state.
			if err := c.ReleaseLease(ctx, thief); err != nil {
				t.Fatal(err)
			}
			runJob(t, c, plan, runtime.Options{Nodes: []string{"total"}, ProcessID: "b"})
			checkState("after process b took over", 20)

			msgs, err := rdb.XRange(ctx, keys.Stream("out", 0), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			_, totals := totalsUpTo(20)
			seen := map[int]int{}
			for _, m := range msgs {
				p := jsonObject(t, m.Values["payload"].(string))
				i := int(p["i"].(float64))
				seen[i]++
				if got := int64(p["total"].(float64)); got != totals[i] {
					t.Errorf("message %d carries the total %d, want %d", i, got, totals[i])
				}
			}
			if dups := tally(t, seen, 20); dups > 0 {
				t.Fatalf("%d messages arrived twice", dups)
			}
		})
	}
}

// A stateful Go function's timers fire once the partition's watermark (the latest event time, from
// the stage's event_time) passes them, in the batch that moved it: what OnTimer emits is committed
// with the deletion of its state. A job's end fires the timers that are not due only when the
// function asks for it (FireAtEnd); otherwise they stay, with their state, for the next run.
func TestStatefulFunctionTimersFire(t *testing.T) {
	t.Parallel()
	for _, b := range allBackends {
		for _, fn := range []string{"test.minutes", "test.minutes_at_end"} {
			t.Run(b.name+"/"+fn, func(t *testing.T) {
				ctx := context.Background()
				c := b.open(t)
				out := filepath.Join(t.TempDir(), "out.jsonl")
				plan := buildSource(t, `
pipeline "minutes" {}
variable "out" {}
topic "in" {
  partitions = 1
  key        = msg.key
}
stage "minutes" {
  kind       = "go"
  func       = "`+fn+`"
  input      = topic.in
  event_time = msg.at
}
sink "out" {
  kind  = "file"
  input = stage.minutes
  path  = var.out
}
`, "out="+out)
				// k1 twice in its first minute, k2 once, then k1 in its second minute (which closes
				// the first), k2 late for its first minute, and k1 in its third.
				pub, err := runtime.NewPublisher(c, plan)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range []string{`"k1","at":0`, `"k1","at":30000`, `"k2","at":45000`, `"k1","at":65000`, `"k2","at":50000`, `"k1","at":130000`} {
					if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(`{"key":`+m+`}`), nil)); err != nil {
						t.Fatal(err)
					}
				}
				if err := pub.Close(ctx); err != nil {
					t.Fatal(err)
				}
				j := runJob(t, c, plan, runtime.Options{})
				want := []string{"k1@60000=2", "k2@60000=1", "k1@120000=1"}
				if fn == "test.minutes_at_end" {
					want = append(want, "k1@180000=1")
				}
				var got []string
				for _, m := range jsonLines(t, readFile(t, out)) {
					got = append(got, fmt.Sprintf("%v@%v=%v", m["key"], m["end"], m["count"]))
				}
				if strings.Join(got, " ") != strings.Join(want, " ") {
					t.Fatalf("reported %v, want %v", got, want)
				}
				// Its messages go into its windows (absorbed when it fires at the end, else filtered)
				// but the late one, dropped; what it reports are entries written.
				if n := j.node(t, "minutes"); n.In != 6 || n.Late != 1 || n.Dropped != 1 || n.Written != int64(len(want)) || n.Absorbed+n.Filtered != 5 {
					t.Fatalf("minutes: %+v", n)
				}

				// What a timer reported, its state no longer holds; what is still open, it does.
				keys := redis.Keys{Prefix: plan.KeyPrefix}
				state, err := c.Universal().HGetAll(ctx, keys.State("in", 0, "minutes")).Result()
				if err != nil {
					t.Fatal(err)
				}
				timers, err := c.Universal().ZRangeWithScores(ctx, keys.Timers("in", 0, "minutes"), 0, -1).Result()
				if err != nil {
					t.Fatal(err)
				}
				if state[redis.WatermarkField] != "130000" {
					t.Fatalf("the watermark is %q, want the latest event time, 130000", state[redis.WatermarkField])
				}
				delete(state, redis.WatermarkField)
				switch {
				case fn == "test.minutes_at_end" && (len(state) != 0 || len(timers) != 0):
					t.Fatalf("after the job's end fired every timer: state %q, timers %v", state, timers)
				case fn == "test.minutes" && (len(state) != 1 || state["k1@180000"] != "1" || len(timers) != 1 ||
					timers[0].Member != "k1@180000" || timers[0].Score != 180000):
					t.Fatalf("the open minute: state %q, timers %v; want k1@180000 in both", state, timers)
				}
			})
		}
	}
}
