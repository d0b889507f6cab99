package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// fusionPoisoned holds the runs whose poison messages fail for good.
var fusionPoisoned sync.Map

// fusionCalls counts the calls of the fusion test functions per run and message.
var fusionCalls sync.Map

func fusionCount(name string, m stages.Message) int64 {
	v, _ := fusionCalls.LoadOrStore(fmt.Sprint(name, "/", m.Value["run"], "/", m.Value["seq"]), new(atomic.Int64))
	return v.(*atomic.Int64).Add(1)
}

func fusionCalled(name, run string, seq int) int64 {
	v, ok := fusionCalls.Load(fmt.Sprint(name, "/", run, "/", seq))
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func init() {
	// fusion.first marks each message with how often it has been called for it.
	stages.Register("fusion.first", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		m.Value["first_calls"] = fusionCount("first", m)
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
	// fusion.split makes two messages of each, told apart by part.
	stages.Register("fusion.split", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		var out []stages.Message
		for part := 0; part < 2; part++ {
			v := map[string]any{}
			for k, x := range m.Value {
				v[k] = x
			}
			v["part"] = part
			out = append(out, stages.Message{Key: m.Key, Value: v})
		}
		return out, nil
	}, stages.KeepsKey())
	// fusion.flaky fails its first attempt at every message; a message marked poison fails for good
	// while its run is in fusionPoisoned.
	stages.Register("fusion.flaky", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		if _, on := fusionPoisoned.Load(m.Value["run"]); on && m.Value["poison"] == true {
			return nil, stages.Permanent(errors.New("poisoned"))
		}
		if fusionCount(fmt.Sprint("flaky", m.Value["part"]), m) == 1 {
			return nil, errors.New("not yet")
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
}

// publishFusion publishes n messages of a run, the one with seq poisonSeq marked poison.
func publishFusion(t *testing.T, pub *runtime.Publisher, run string, n, poisonSeq int) {
	t.Helper()
	for i := 0; i < n; i++ {
		m := fmt.Sprintf(`{"key":"k%d","seq":%d,"run":%q,"poison":%v}`, i%4, i, run, i == poisonSeq)
		if err := pub.Publish(context.Background(), "in", stages.NewMessage("", []byte(m), nil)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAFusedStageRetriesFromItself runs three stages fused in one hop. The third fails each
// message's first attempt; its retries wait in the chain's retry set and start again at the third
// stage, with the message as the second made it: the first stage runs once per message, each
// message's two parts arrive once each, and every stage counts what it did as if it ran alone. A
// message the third stage dead-letters goes back to it alone when replayed.
func TestAFusedStageRetriesFromItself(t *testing.T) {
	t.Parallel()
	const n = 20
	for _, b := range []backend{server, cluster} {
		for _, delivery := range []string{"at_least_once", "effectively_once"} {
			t.Run(b.name+"/"+delivery, func(t *testing.T) {
				c := b.open(t)
				out := filepath.Join(t.TempDir(), "out.jsonl")
				run := t.Name() + itoa(prefixes.Add(1))
				plan := buildTestdata(t, "fusion.hcl", "out="+out, "run="+run, "delivery="+delivery)
				if len(plan.Chains) != 1 || plan.Chains[0].Name() != "first+split+flaky" {
					t.Fatalf("chains %v, want first+split+flaky", plan.Chains)
				}
				pub, err := runtime.NewPublisher(c, plan)
				if err != nil {
					t.Fatal(err)
				}
				fusionPoisoned.Store(run, true)
				publishFusion(t, pub, run, n, 7)
				if err := pub.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				j := runJob(t, c, plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})

				parts := arrivedParts(t, readFile(t, out))
				for seq := 0; seq < n; seq++ {
					want := 1
					if seq == 7 {
						want = 0
					}
					for part := 0; part < 2; part++ {
						if got := parts[[2]int{seq, part}]; got != want {
							t.Errorf("message %d part %d arrived %d times, want %d", seq, part, got, want)
						}
					}
					if calls := fusionCalled("first", run, seq); calls != 1 {
						t.Errorf("the first stage ran %d times for message %d, want once: a retry of the third started the chain again", calls, seq)
					}
				}
				if got := strings.Count(j.log, "retry scheduled"); got != 2*(n-1) {
					t.Errorf("%d retries went through the retry set, want %d", got, 2*(n-1))
				}
				// in, out (messages passed on), dead-lettered, and entries written: split makes two of each.
				want := map[string][4]int64{"first": {n, n, 0, n}, "split": {n, n, 0, 2 * n}, "flaky": {2 * n, 2 * (n - 1), 2, 2 * (n - 1)}}
				for name, w := range want {
					if s := j.node(t, name); s.In != w[0] || s.Out != w[1] || s.DeadLettered != w[2] || s.Written != w[3] {
						t.Errorf("%s: in %d out %d dead-lettered %d written %d, want %v", name, s.In, s.Out, s.DeadLettered, s.Written, w)
					}
				}

				// The poisoned message's two parts are the third stage's dead letters, as the second
				// stage made them; replayed once the poison is cured, they start at the third stage.
				dl, err := admin.OpenDeadLetters(c, plan, "flaky")
				if err != nil {
					t.Fatal(err)
				}
				list, err := dl.List(context.Background())
				if err != nil || len(list) != 2 {
					t.Fatalf("flaky has %d dead letters (%v), want 2", len(list), err)
				}
				var ids []string
				for _, d := range list {
					var p map[string]any
					if err := json.Unmarshal(d.Envelope.Payload, &p); err != nil || p["first_calls"] == nil || p["part"] == nil {
						t.Errorf("a dead letter holds %s, want the message as the second stage made it", d.Envelope.Payload)
					}
					ids = append(ids, d.ID)
				}
				res, err := dl.Replay(context.Background(), ids)
				if err != nil || len(res.Replayed) != 2 {
					t.Fatalf("replay: %+v %v", res, err)
				}
				fusionPoisoned.Delete(run)
				runJob(t, c, plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
				parts = arrivedParts(t, readFile(t, out))
				for part := 0; part < 2; part++ {
					if got := parts[[2]int{7, part}]; got != 1 {
						t.Errorf("after the replay, message 7 part %d arrived %d times, want once", part, got)
					}
				}
				if calls := fusionCalled("first", run, 7); calls != 1 {
					t.Errorf("the first stage ran %d times for the replayed message, want once", calls)
				}
			})
		}
	}
}

// arrivedParts counts the arrivals of each message part in a file sink's output.
func arrivedParts(t *testing.T, out string) map[[2]int]int {
	t.Helper()
	parts := map[[2]int]int{}
	for _, m := range jsonLines(t, out) {
		parts[[2]int{int(m["seq"].(float64)), int(m["part"].(float64))}]++
	}
	return parts
}

// TestLeftoversOfAnUnfusedRunAreRead starts a chain's first stage alone, unfused, so that the
// stream between it and the next stage fills, then runs the whole pipeline fused: the link runs as
// a stream this time, and every message arrives.
func TestLeftoversOfAnUnfusedRunAreRead(t *testing.T) {
	const n = 12
	c := server.open(t)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	run := t.Name() + itoa(prefixes.Add(1))
	plan := buildTestdata(t, "fusion.hcl", "out="+out, "run="+run, "in_place=true")
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	publishFusion(t, pub, run, n, -1)
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	runJob(t, c, plan, runtime.Options{NoFusion: true, Nodes: []string{"first"}})
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	var waiting int64
	for p := 0; p < 2; p++ {
		l, err := c.StreamLen(context.Background(), keys.Stream("first.out", p))
		if err != nil {
			t.Fatal(err)
		}
		waiting += l
	}
	if waiting != n {
		t.Fatalf("the stream after the first stage holds %d entries, want %d", waiting, n)
	}
	j := runJob(t, c, plan, runtime.Options{})
	if !strings.Contains(j.log, "stage runs unfused this time") {
		t.Errorf("the log does not say that split ran unfused:\n%s", j.log)
	}
	parts := arrivedParts(t, readFile(t, out))
	var missing []string
	for seq := 0; seq < n; seq++ {
		for part := 0; part < 2; part++ {
			if parts[[2]int{seq, part}] != 1 {
				missing = append(missing, fmt.Sprintf("%d/%d:%d", seq, part, parts[[2]int{seq, part}]))
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("messages that did not arrive once (seq/part:times): %v", missing)
	}
}

// TestARetryForAFusedStageReachesItUnfused replays dead letters of a fused chain's third stage,
// which go to the chain's retry set marked with the stage, and then runs the pipeline unfused: the
// first stage's unit, which reads that retry set, passes each on to the third stage's input, and
// they arrive once, without running the stages before it again.
func TestARetryForAFusedStageReachesItUnfused(t *testing.T) {
	const n = 8
	c := server.open(t)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	run := t.Name() + itoa(prefixes.Add(1))
	plan := buildTestdata(t, "fusion.hcl", "out="+out, "run="+run)
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	fusionPoisoned.Store(run, true)
	publishFusion(t, pub, run, n, 3)
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	runJob(t, c, plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond})
	dl, err := admin.OpenDeadLetters(c, plan, "flaky")
	if err != nil {
		t.Fatal(err)
	}
	list, err := dl.List(context.Background())
	if err != nil || len(list) != 2 {
		t.Fatalf("flaky has %d dead letters (%v), want 2", len(list), err)
	}
	if _, err := dl.Replay(context.Background(), []string{list[0].ID, list[1].ID}); err != nil {
		t.Fatal(err)
	}
	fusionPoisoned.Delete(run)
	j := runJob(t, c, plan, runtime.Options{RetryInPlaceUpTo: time.Millisecond, NoFusion: true})
	parts := arrivedParts(t, readFile(t, out))
	for part := 0; part < 2; part++ {
		if got := parts[[2]int{3, part}]; got != 1 {
			t.Errorf("message 3 part %d arrived %d times, want once", part, got)
		}
	}
	if calls := fusionCalled("first", run, 3); calls != 1 {
		t.Errorf("the first stage ran %d times for the replayed message, want once", calls)
	}
	if s := j.node(t, "split"); s.In != 0 {
		t.Errorf("split read %d messages in the unfused run, want none: the retries were for flaky", s.In)
	}
	if s := j.node(t, "first"); s.Out != 2 || s.DeadLettered != 0 {
		t.Errorf("first: %+v, want the 2 retries passed on to flaky's input", s)
	}
}

func init() {
	// fusion.liar is registered with KeepsKey, but gives the messages marked rekey another key.
	stages.Register("fusion.liar", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		if m.Value["rekey"] == true {
			m.Key = "other"
		}
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
}

// TestAKeepsKeyFunctionThatChangesAKeyIsCaught: a Go function registered with stages.KeepsKey
// has the stage after it fused with it, which relies on the declaration. A message the function
// passes on with another key is dead-lettered at once by the function's stage, with an error that
// names the function, and goes no further; the others go on. The declaration is held to with the
// chain fused or not.
func TestAKeepsKeyFunctionThatChangesAKeyIsCaught(t *testing.T) {
	fusedAndNot(t, func(t *testing.T, noFusion bool) {
		const n = 8
		c := server.open(t)
		out := filepath.Join(t.TempDir(), "out.jsonl")
		plan := buildSource(t, `
pipeline "liar" {}
variable "out" {}
topic "in" {
  partitions = 2
  key        = msg.key
}
stage "liar" {
  kind  = "go"
  func  = "fusion.liar"
  input = topic.in
}
stage "after" {
  kind  = "filter"
  input = stage.liar
  where = true
}
sink "out" {
  kind  = "file"
  input = stage.after
  path  = var.out
}
`, "out="+out)
		if len(plan.Chains) != 1 || plan.Chains[0].Name() != "liar+after" {
			t.Fatalf("chains %v, want liar+after", plan.Chains)
		}
		pub, err := runtime.NewPublisher(c, plan)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			m := fmt.Sprintf(`{"key":"k%d","seq":%d,"rekey":%v}`, i, i, i%4 == 1)
			if err := pub.Publish(context.Background(), "in", stages.NewMessage("", []byte(m), nil)); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		j := runJob(t, c, plan, runtime.Options{NoFusion: noFusion})

		var arrived []int
		for _, m := range jsonLines(t, readFile(t, out)) {
			arrived = append(arrived, int(m["seq"].(float64)))
		}
		sort.Ints(arrived)
		if got := fmt.Sprint(arrived); got != "[0 2 3 4 6 7]" {
			t.Errorf("arrived %s, want every message but 1 and 5", got)
		}
		if s := j.node(t, "liar"); s.In != n || s.Out != n-2 || s.DeadLettered != 2 || s.Retries != 0 {
			t.Errorf("liar: %+v, want %d in, %d out, 2 dead-lettered at once", s, n, n-2)
		}
		if s := j.node(t, "after"); s.In != n-2 || s.DeadLettered != 0 {
			t.Errorf("after: %+v, want the %d others", s, n-2)
		}
		dl, err := admin.OpenDeadLetters(c, plan, "liar")
		if err != nil {
			t.Fatal(err)
		}
		list, err := dl.List(context.Background())
		if err != nil || len(list) != 2 {
			t.Fatalf("liar has %d dead letters (%v), want 2", len(list), err)
		}
		for _, d := range list {
			want := `the Go stage function "fusion.liar" is registered with stages.KeepsKey, but changed a message's key from "` +
				d.Envelope.Key + `" to "other"`
			if !strings.Contains(d.Envelope.Error, want) || d.Envelope.Attempts != 1 {
				t.Errorf("dead letter of %s after %d attempts: %q, want it to say %s", d.Envelope.Key, d.Envelope.Attempts, d.Envelope.Error, want)
			}
		}
	})
}
