package runtime_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A pattern over payments through SIGKILLs: two small payments then a big one on a card within 10
// minutes, with matches planted among near-misses (a big one too late, probes on another card) and
// late payments. The test computes the matches from what it wrote and compares, match by match.

func patternPipeline(prefix string) string {
	return fmt.Sprintf(`
pipeline "patterns" {
  key_prefix = %q
  delivery   = "effectively_once"
}
variable "out" {}
variable "late" {}
topic "payments" {
  partitions = 4
  key        = msg.id
}
topic "late" {}
stage "card_testing" {
  kind       = "pattern"
  input      = topic.payments
  key        = msg.card
  event_time = msg.ts
  sequence = [
    { name = "probe1", where = msg.amount < 2 },
    { name = "probe2", where = msg.amount < 2 },
    { name = "big", where = msg.amount > 500 },
  ]
  within = "10m"
  grace  = "30s"
  late   = topic.late
  select = { card = big.card, ids = [probe1.id, probe2.id, big.id] }
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.card_testing
  stream = var.out
}
sink "late" {
  kind   = "redis_stream"
  input  = topic.late
  stream = var.late
}
`, prefix)
}

type cardPayment struct {
	id, card string
	amount   float64
	ts       int64
}

// cardPayments draws n payments of cards, in the order they are written: a second apart with up to
// 20 seconds of disorder, one in 60 an hour behind (late); a card's payments are mostly probes
// (amount 1) and big ones (900), the rest ordinary, so that sequences form, and fail to.
func cardPayments(seed uint64, n, cards int) []cardPayment {
	rng := rand.New(rand.NewPCG(seed, 5))
	base := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC).UnixMilli()
	var out []cardPayment
	used := map[int64]bool{} // no two payments at one time: their order would be the arrival's
	for i := range n {
		ts := base + int64(i)*1000 + rng.Int64N(20_000)
		if i%60 == 59 {
			ts -= int64(time.Hour / time.Millisecond)
		}
		for used[ts] {
			ts++
		}
		used[ts] = true
		amount := []float64{1, 1, 1, 900, 50}[rng.IntN(5)]
		out = append(out, cardPayment{id: fmt.Sprint("p", i), card: fmt.Sprint("c", rng.IntN(cards)), amount: amount, ts: ts})
	}
	return out
}

// referenceCardTesting computes the matches another way: a payment is late when it is more than
// grace behind the latest payment written before it to its partition (the topic is keyed by id);
// the others, per card in event-time order (arrival order for equal times), match from each probe
// the first later probe, then the first later big payment, within 10 minutes of the first probe.
func referenceCardTesting(payments []cardPayment) (matches, late []string) {
	const grace, within = 30_000, 600_000
	latest := make([]int64, 4)
	perCard := map[string][]cardPayment{}
	for _, p := range payments {
		part := redis.Partition(p.id, 4)
		latest[part] = max(latest[part], p.ts)
		if p.ts+grace < latest[part] {
			late = append(late, p.id)
			continue
		}
		perCard[p.card] = append(perCard[p.card], p)
	}
	for _, ps := range perCard {
		sort.SliceStable(ps, func(i, j int) bool { return ps[i].ts < ps[j].ts })
		for i, first := range ps {
			if first.amount >= 2 {
				continue
			}
			taken := []cardPayment{first}
			for _, p := range ps[i+1:] {
				if p.ts-first.ts > within || len(taken) == 3 {
					break
				}
				if len(taken) < 2 && p.amount < 2 || len(taken) == 2 && p.amount > 500 {
					taken = append(taken, p)
				}
			}
			if len(taken) == 3 {
				matches = append(matches, taken[0].id+","+taken[1].id+","+taken[2].id)
			}
		}
	}
	sort.Strings(matches)
	sort.Strings(late)
	return matches, late
}

// TestPatternExactlyOnceThroughKillCycles runs the pattern with effectively-once delivery in flowrun
// processes that are killed mid-stream, over and over (10 times; 50 with -soak, on more payments),
// then to the end as a job: every match of the reference comes out exactly once, every late
// payment goes to the late topic once, and nothing else comes out.
func TestPatternExactlyOnceThroughKillCycles(t *testing.T) {
	t.Parallel()
	payments, cards, cycles := 6000, 150, 10
	if *soakFlag {
		payments, cycles = 30_000, 50
	}
	bin := flowrunBinary(t)
	for _, b := range processBackends {
		t.Run(b.name, func(t *testing.T) {
			urls := b.urls(t)
			c := openURLs(t, urls...)
			prefix := fmt.Sprintf("killpattern-%d", prefixes.Add(1))
			out, lateStream := prefix+":out", prefix+":late"
			path := filepath.Join(t.TempDir(), "patterns.hcl")
			writeFile(t, path, patternPipeline(prefix))
			plan, _, diags := flow.Build(path, flow.Options{Vars: []string{"out=" + out, "late=" + lateStream}})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			ps := cardPayments(uint64(len(b.name)), payments, cards)
			pub, err := runtime.NewPublisher(c, plan)
			if err != nil {
				t.Fatal(err)
			}
			msgs := make([]stages.Message, 0, len(ps))
			for _, p := range ps {
				msgs = append(msgs, stages.NewMessage("", fmt.Appendf(nil, `{"id":%q,"card":%q,"amount":%v,"ts":%d}`, p.id, p.card, p.amount, p.ts), nil))
			}
			if err := pub.PublishBatch(context.Background(), "payments", msgs); err != nil {
				t.Fatal(err)
			}
			if err := pub.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			keys := redis.Keys{Prefix: prefix}
			// The pattern reads the payments repartitioned by card: its progress is what it has
			// taken in of that topic.
			inputs := keys.Streams("card_testing.by_key", 4)
			done := func() int {
				n := 0
				for _, s := range inputs {
					length, err := c.Universal().XLen(context.Background(), s).Result()
					if err != nil {
						t.Fatal(err)
					}
					n += int(length - backlogOf(t, c, s, "card_testing"))
				}
				return n
			}
			args := append([]string{"run", path, "--var", "out=" + out, "--var", "late=" + lateStream, "--lease-ttl", "300ms", "--batch-size", "20"},
				redisArgs(urls)...)
			var logs []string
			midBatch, cycle := 0, 0
			for ; cycle < cycles && done() < payments*4/5; cycle++ {
				// The kill point: a random number more payments taken in, polled without pause.
				target := done() + 20 + rand.IntN(payments/(2*cycles))
				p := startBinary(t, bin, args...)
				for deadline := time.Now().Add(time.Minute); done() < target || mostDelivered(t, c, "card_testing", inputs...) > 2; {
					if time.Now().After(deadline) {
						t.Fatalf("cycle %d: the pattern did not take in %d payments in a minute", cycle, target)
					}
				}
				p.kill(t)
				if pendingFor(t, c, keys, "card_testing.by_key", 4, "card_testing", "") > 0 {
					midBatch++
				}
				logs = append(logs, p.log.String())
			}
			last := startBinary(t, bin, append(args, "--until-drained")...)
			if err := waitProcess(t, last); err != nil {
				t.Fatalf("the last process, run as a job to the end: %v\n%s", err, last.log.String())
			}
			wantMatches, wantLate := referenceCardTesting(ps)
			var matches, late []string
			for _, m := range streamPayloads(t, c, out) {
				var ids []string
				for _, id := range m["ids"].([]any) {
					ids = append(ids, id.(string))
				}
				matches = append(matches, strings.Join(ids, ","))
			}
			for _, m := range streamPayloads(t, c, lateStream) {
				late = append(late, m["id"].(string))
			}
			sort.Strings(matches)
			sort.Strings(late)
			if !slices.Equal(late, wantLate) {
				t.Fatalf("%d late payments, want %d; the first that differs: %s", len(late), len(wantLate), firstDifference(late, wantLate))
			}
			if !slices.Equal(matches, wantMatches) {
				t.Fatalf("%d matches, want %d; the first that differs: %s", len(matches), len(wantMatches), firstDifference(matches, wantMatches))
			}
			if len(wantMatches) < 20 || len(wantLate) == 0 {
				t.Fatalf("%d matches and %d late payments: the data tests too little", len(wantMatches), len(wantLate))
			}
			if cycle < 3 || midBatch == 0 {
				t.Errorf("%d SIGKILL cycles, %d with batches in flight: too few to test anything", cycle, midBatch)
			}
			t.Logf("%d SIGKILL cycles, %d with batches in flight, %d matches, %d late, %d leases lost", cycle, midBatch,
				len(matches), len(late), leaseLosses(append(logs, last.log.String())...))
		})
	}
}
