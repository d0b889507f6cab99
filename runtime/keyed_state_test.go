package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// test_count is a stateful stage kind of the tests: it counts the messages of each key in its state,
// and passes each message on with the count so far. It keeps a timer per key, due a minute after the
// key's latest message (its created field, Unix ms), and forgets the key and its timer at the count
// given by the forget_at attribute. Its first attempt at every message whose seq ends in 3 fails
// after it wrote the new count, once per run: the failed attempt's writes must not count.
func init() {
	stages.RegisterStage(stages.StageKind{
		Spec: &flow.Kind{
			Name:       "test_count",
			Doc:        "Counts the messages of each key (a stateful stage of the tests).",
			Attributes: []flow.Attribute{{Name: "forget_at", Type: flow.TypeInteger, Required: true, Doc: "The count at which a key is forgotten."}},
			Example: `stage "count" {
  kind      = "test_count"
  input     = topic.in
  forget_at = 20
}`,
		},
		Traits: stages.StageTraits{Stateful: true},
		NewStateful: func(s *flow.Stage, env stages.Env) (stages.StatefulStage, error) {
			return stages.StatefulStage{Processor: &countStage{out: s.Output, forgetAt: int(s.Config.Int("forget_at"))}}, nil
		},
	})
}

type countStage struct {
	out      *flow.Topic
	forgetAt int
}

// countFailed holds the messages whose first attempt test_count failed, by run and seq.
var countFailed sync.Map

func (s *countStage) Process(ctx context.Context, st stages.State, m *stages.Message, out []stages.Output) ([]stages.Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	v, _, err := st.Get(ctx, m.Key)
	if err != nil {
		return out, err
	}
	n, _ := strconv.Atoi(string(v))
	n++
	if n == s.forgetAt {
		err = errors.Join(st.Delete(ctx, m.Key), st.CancelTimer(ctx, "close:"+m.Key))
	} else {
		err = errors.Join(st.Put(ctx, m.Key, []byte(strconv.Itoa(n))),
			st.SetTimer(ctx, "close:"+m.Key, time.UnixMilli(60_000+int64(n))))
	}
	if err != nil {
		return out, err
	}
	seq := fmt.Sprint(m.Value["seq"])
	if strings.HasSuffix(seq, "3") {
		if _, seen := countFailed.LoadOrStore(fmt.Sprint(m.Value["run"], "/", seq), true); !seen {
			return out, errors.New("failing after the write")
		}
	}
	m.Value["count"] = n
	m.Changed()
	return append(out, stages.Output{Topic: s.out, Message: *m}), nil
}

// A stateful stage's state survives from one run to the next, lives in its partition's slot (the
// cluster's commit would refuse keys of other slots), and keeps no write of a failed attempt: every
// key's counts, over two jobs and with retried messages, are exactly 1 to 20 in order.
func TestStatefulStageKeepsItsStateWithItsAcks(t *testing.T) {
	t.Parallel()
	const keys, perRun = 5, 60
	src := `
pipeline "count" {}
variable "out" {}
variable "from" {}
variable "run" {}
retry "fast" {
  max_attempts = 3
  initial      = "1ms"
  max          = "5ms"
}
topic "in" {
  partitions = 3
  key        = msg.key
}
source "gen" {
  kind     = "generate"
  count    = ` + strconv.Itoa(perRun) + `
  output   = topic.in
  template = { key = "k${index % ` + strconv.Itoa(keys) + `}", seq = index + tonumber(var.from), run = var.run }
}
stage "count" {
  kind      = "test_count"
  input     = topic.in
  retry     = retry.fast
  forget_at = ` + strconv.Itoa(2*perRun/keys) + `
}
sink "out" {
  kind  = "file"
  input = stage.count
  path  = var.out
}
`
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			out := filepath.Join(t.TempDir(), "out.jsonl")
			run := t.Name() + itoa(prefixes.Add(1))
			first := buildSource(t, src, "out="+out, "from=0", "run="+run)
			j := runJob(t, c, first, runtime.Options{})
			if n := j.node(t, "count"); n.FailedAttempts != perRun/10 || n.DeadLettered != 0 {
				t.Fatalf("count, first run: %+v", n)
			}
			// Every key has its count and its timer, in its partition's slot.
			keysOf := redis.Keys{Prefix: first.KeyPrefix}
			stateKeys, timers := 0, 0
			for p := 0; p < 3; p++ {
				fields, err := c.Universal().HKeys(context.Background(), keysOf.State("in", p, "count")).Result()
				if err != nil {
					t.Fatal(err)
				}
				h := 0
				for _, f := range fields {
					if !strings.HasPrefix(f, "\x00") { // the runtime's own (the watermark)
						h++
					}
				}
				z, err := c.Universal().ZCard(context.Background(), keysOf.Timers("in", p, "count")).Result()
				if err != nil {
					t.Fatal(err)
				}
				stateKeys, timers = stateKeys+int(h), timers+int(z)
			}
			if stateKeys != keys || timers != keys {
				t.Fatalf("after the first run: state of %d keys and %d timers, want %d of each", stateKeys, timers, keys)
			}
			second := buildSource(t, src, "out="+out, "from="+strconv.Itoa(perRun), "run="+run)
			second.KeyPrefix = first.KeyPrefix // the same pipeline again
			runJob(t, c, second, runtime.Options{})

			got := jsonLines(t, readFile(t, out))
			if dups := tally(t, countBy(t, got, "seq"), 2*perRun); dups > 0 {
				t.Fatalf("%d messages arrived twice", dups)
			}
			counts := map[string][]int{}
			for _, m := range got {
				n, ok := m["count"].(float64)
				if !ok {
					t.Fatalf("a message without its count: %v", m)
				}
				counts[m["key"].(string)] = append(counts[m["key"].(string)], int(n))
			}
			for k, seen := range counts {
				for i, n := range seen {
					if n != i+1 {
						t.Fatalf("key %s: counts %v, want 1 to %d in order", k, seen, 2*perRun/keys)
					}
				}
				if len(seen) != 2*perRun/keys {
					t.Fatalf("key %s: %d counts, want %d", k, len(seen), 2*perRun/keys)
				}
			}
			// At the last count every key and its timer were forgotten: the watermark is all that is left.
			for p := 0; p < 3; p++ {
				h, _ := c.Universal().HLen(context.Background(), keysOf.State("in", p, "count")).Result()
				if c.Universal().HExists(context.Background(), keysOf.State("in", p, "count"), redis.WatermarkField).Val() {
					h--
				}
				z, _ := c.Universal().ZCard(context.Background(), keysOf.Timers("in", p, "count")).Result()
				if h != 0 || z != 0 {
					t.Fatalf("partition %d keeps the state of %d keys and %d timers after they were forgotten", p, h, z)
				}
			}
		})
	}
}
