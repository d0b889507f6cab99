package stages

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
)

// cardTesting is the pattern of the reference: two small payments, then a big one, within 10
// minutes, per card.
const cardTesting = `
stage "card_testing" {
  kind       = "pattern"
  input      = topic.in
  output     = topic.a
  key        = msg.card
  event_time = msg.ts
  sequence = [
    { name = "probe1", where = msg.amount < 2 },
    { name = "probe2", where = msg.amount < 2 },
    { name = "big", where = msg.amount > 500 },
  ]
  within = "10m"
  grace  = "%s"
  late   = "drop"
  select = { card = big.card, amount = big.amount, first = probe1.id, second = probe2.id, last = big.id }
}
`

func payment(id, card string, minute int, amount float64) string {
	return fmt.Sprintf(`{"id":%q,"card":%q,"ts":%d,"amount":%v}`, id, card, int64(minute)*60000, amount)
}

// matches lists the outputs as "first,second,last", sorted.
func matches(t *testing.T, outs []Output) []string {
	t.Helper()
	var got []string
	for _, o := range outs {
		if o.DeadLetter != "" {
			t.Fatalf("a dead letter among the outputs: %s", o.DeadLetter)
		}
		v := o.Message.Value
		got = append(got, fmt.Sprintf("%v,%v,%v", v["first"], v["second"], v["last"]))
	}
	sort.Strings(got)
	return got
}

// Events match in event-time order whatever order they arrive in, once the watermark is past them;
// a match emits once, keyed by the key, at its last step's time.
func TestAPatternMatchesInEventTimeOrder(t *testing.T) {
	proc, st := statefulProcessor(t, fmt.Sprintf(cardTesting, "5m")+sinkA, "card_testing")
	// The big payment arrives first; the probes, earlier in event time, after it.
	outs, errs := st.batch(t, proc,
		payment("big", "c1", 3, 900), payment("p1", "c1", 1, 1), payment("p2", "c1", 2, 1.5), payment("other", "c2", 2, 1))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(outs) != 0 {
		t.Fatalf("%d results before the watermark passed the events plus grace", len(outs))
	}
	outs, _ = st.batch(t, proc, payment("tick", "c3", 9, 100))
	if got := matches(t, outs); !slices.Equal(got, []string{"p1,p2,big"}) {
		t.Fatalf("matches %v, want [p1,p2,big]", got)
	}
	if o := outs[0]; o.Message.Key != "c1" || o.Message.Headers[EventTimeHeader] != "180000" {
		t.Fatalf("key %q, event time %q: want c1 at its big payment's time", o.Message.Key, o.Message.Headers[EventTimeHeader])
	}
	// An event more than grace behind the watermark is late: it counts as late and matches nothing.
	_, errs = st.batch(t, proc, payment("old", "c1", 2, 1))
	if errs[0] != nil || st.late != 1 {
		t.Fatalf("a late event: %v, late %d; want it dropped and counted", errs[0], st.late)
	}
	// At the end every waiting event matches, and the state is empty.
	outs, _ = st.batch(t, proc, payment("q1", "c4", 10, 1), payment("q2", "c4", 11, 1), payment("q3", "c4", 12, 700))
	outs = append(outs, st.end(t, proc)...)
	if got := matches(t, outs); !slices.Equal(got, []string{"q1,q2,q3"}) {
		t.Fatalf("at the end: %v, want [q1,q2,q3]", got)
	}
	if len(st.values) != 1 || st.keyCount(t) != 0 || len(st.holds) != 0 || len(st.timers) != 0 {
		t.Fatalf("state %v, holds %v, timers %v after the end: want only a key count of 0", st.values, st.holds, st.timers)
	}
}

// A match spans within at most; an attempt that cannot finish in time is given up, and its key
// forgotten once nothing waits.
func TestAPatternMatchesWithin(t *testing.T) {
	proc, st := statefulProcessor(t, fmt.Sprintf(cardTesting, "0s")+sinkA, "card_testing")
	outs, _ := st.batch(t, proc, payment("p1", "c1", 0, 1), payment("p2", "c1", 1, 1), payment("big", "c1", 11, 900))
	outs = append(outs, st.end(t, proc)...)
	// p1 at 0 and big at 11 are 11 minutes apart; p2 at 1 starts an attempt that needs another probe.
	if got := matches(t, outs); len(got) != 0 {
		t.Fatalf("matches %v, want none: the sequence spans more than within", got)
	}
	if len(st.values) != 1 || st.keyCount(t) != 0 || len(st.holds) != 0 {
		t.Fatalf("state %v, holds %v: want the key forgotten", st.values, st.holds)
	}
}

// The stage's results equal a reference matcher's on random payments that arrive out of order,
// in random batches: what matches depends on event times only, not on arrival or batches.
func TestAPatternEqualsTheReferenceOnRandomEvents(t *testing.T) {
	for seed := range uint64(100) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			grace := rng.IntN(6) // minutes
			proc, st := statefulProcessor(t, fmt.Sprintf(cardTesting, fmt.Sprintf("%dm", grace))+sinkA, "card_testing")
			var events []refEvent
			for i := range 60 + rng.IntN(60) {
				amount := []float64{1, 1.5, 50, 900, 900}[rng.IntN(5)]
				e := refEvent{id: fmt.Sprintf("e%d", i), card: fmt.Sprintf("c%d", rng.IntN(2)), minute: i/3 + rng.IntN(8), amount: amount}
				events = append(events, e)
			}
			// Arrival order: mostly by time, with some events moved back.
			rng.Shuffle(len(events), func(i, j int) {
				if abs(i-j) < 6 {
					events[i], events[j] = events[j], events[i]
				}
			})
			var outs []Output
			for rest := events; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(8))
				payloads := make([]string, n)
				for i, e := range rest[:n] {
					payloads[i] = payment(e.id, e.card, e.minute, e.amount)
				}
				o, errs := st.batch(t, proc, payloads...)
				for _, err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
				outs = append(outs, o...)
				rest = rest[n:]
			}
			outs = append(outs, st.end(t, proc)...)
			want := referencePatternMatches(events, grace, 10)
			if got := matches(t, outs); !slices.Equal(got, want) {
				t.Fatalf("matches\n%v\nwant\n%v", got, want)
			}
		})
	}
}

type refEvent struct {
	id, card string
	minute   int
	amount   float64
}

// referencePatternMatches computes the card-testing matches another way: an event is late when it
// is more than grace minutes behind the latest event time that arrived before it or with it; the
// others, per card, sorted by time then arrival, are searched from each probe for the first later
// probe and then the first later big payment within `within` minutes of it.
func referencePatternMatches(arrivals []refEvent, grace, within int) []string {
	type placed struct {
		refEvent
		arrival int
	}
	perCard := map[string][]placed{}
	latest := -1 << 31
	for i, e := range arrivals {
		latest = max(latest, e.minute)
		if e.minute+grace < latest {
			continue // late
		}
		perCard[e.card] = append(perCard[e.card], placed{e, i})
	}
	probe := func(e placed) bool { return e.amount < 2 }
	big := func(e placed) bool { return e.amount > 500 }
	var out []string
	for _, events := range perCard {
		sort.SliceStable(events, func(i, j int) bool {
			if events[i].minute != events[j].minute {
				return events[i].minute < events[j].minute
			}
			return events[i].arrival < events[j].arrival
		})
		steps := []func(placed) bool{probe, probe, big}
		for i, first := range events {
			if !probe(first) {
				continue
			}
			taken := []string{first.id}
			for j := i + 1; j < len(events) && len(taken) < len(steps); j++ {
				if events[j].minute-first.minute > within {
					break
				}
				if steps[len(taken)](events[j]) {
					taken = append(taken, events[j].id)
				}
			}
			if len(taken) == len(steps) {
				out = append(out, strings.Join(taken, ","))
			}
		}
	}
	sort.Strings(out)
	return out
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// The kind's located errors: steps without a name or where, a select that names no step, a
// non-positive within.
func TestAPatternRefusesWhatCannotMatch(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"no where", `sequence = [{ name = "a" }]
  select = { x = a.id }`, "Incomplete step"},
		{"unknown step in select", `sequence = [{ name = "a", where = msg.x > 1 }]
  select = { x = b.id }`, `"b"`},
		{"reserved name", `sequence = [{ name = "msg", where = msg.x > 1 }]
  select = { x = msg.id }`, "Invalid step name"},
		{"duplicate step", `sequence = [{ name = "a", where = msg.x > 1 }, { name = "a", where = msg.x > 2 }]
  select = { x = a.id }`, "Duplicate step"},
		{"empty sequence", `sequence = []
  select = { x = 1 }`, "Invalid value for sequence"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := `
stage "p" {
  kind   = "pattern"
  input  = topic.in
  output = topic.a
  key    = msg.k
  within = "1m"
  ` + c.body + `
}
` + sinkA
			diags := compileDiags(t, src)
			if !strings.Contains(diags, c.want) {
				t.Fatalf("diagnostics:\n%s\nwant %q", diags, c.want)
			}
		})
	}
}

// compileDiags compiles a pipeline as plan does and returns its diagnostics as text.
func compileDiags(t *testing.T, stagesSrc string) string {
	t.Helper()
	src := "pipeline \"t\" {}\ntopic \"in\" {}\ntopic \"a\" {}\nsource \"s\" {\n  kind   = \"stdin\"\n  output = topic.in\n}\n" + stagesSrc
	cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
	if !diags.HasErrors() {
		_, more := flow.Compile(cfg, flow.Options{GoFuncs: Names()})
		diags = append(diags, more...)
	}
	return diags.Error()
}
