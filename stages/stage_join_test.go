package stages

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// joinSrc is a join of views (left) and clicks (right) by ad, with the type, span and grace given.
func joinSrc(typ, before, after, grace string) string {
	return fmt.Sprintf(`
topic "clicks" {}
source "c" {
  kind   = "stdin"
  output = topic.clicks
}
stage "j" {
  kind = "join"
  type = %q
  left {
    input      = topic.in
    key        = msg.ad
    event_time = msg.ts
  }
  right {
    input      = topic.clicks
    key        = msg.ad
    event_time = msg.ts
  }
  output = topic.a
  before = %q
  after  = %q
  grace  = %q
  late   = "drop"
  max_per_key = 5
  select = { ad = left.ad, view = left.id, click = right.id }
}
`+sinkA, typ, before, after, grace)
}

// joinEvent is an event of the tests: a view (left) or a click (right) of an ad at a minute.
type sideEvent struct {
	id, ad string
	left   bool
	minute int
}

// message is the event as the join reads it: keyed by its ad and tagged by its side's
// repartition stage.
func (e sideEvent) message() Message {
	side := joinRight
	if e.left {
		side = joinLeft
	}
	at := int64(e.minute) * 60000
	return NewMessage(e.ad, fmt.Appendf(nil, `{"id":%q,"ad":%q,"ts":%d}`, e.id, e.ad, at),
		map[string]string{SideHeader: side, EventTimeHeader: strconv.FormatInt(at, 10)})
}

// joinBatch processes events as one batch, as memState.batch does payloads.
func (s *memState) joinBatch(t *testing.T, proc StatefulStage, events ...sideEvent) ([]Output, []error) {
	t.Helper()
	ctx := context.Background()
	var outs []Output
	errs := make([]error, len(events))
	for i, e := range events {
		m := e.message()
		s.observe(&m)
		errs[i] = s.attempt(func() error {
			o, err := proc.Processor.Process(ctx, s.state(), &m, outs)
			if err == nil {
				outs = o
			}
			return err
		})
	}
	return s.fire(t, ctx, proc, s.watermark, outs), errs
}

// rows lists the outputs as "view,click" (<nil> for a side that is null), sorted.
func rows(t *testing.T, outs []Output) []string {
	t.Helper()
	var got []string
	for _, o := range outs {
		v := o.Message.Value
		got = append(got, fmt.Sprintf("%v,%v", v["view"], v["click"]))
	}
	sort.Strings(got)
	return got
}

// A left join: a match is emitted when its second event arrives, whichever side that is; a view
// that matched nothing comes out alone, with the click null, once the watermark has passed its
// span plus grace, and never before one of its matches.
func TestALeftJoinMatchesWithinItsSpan(t *testing.T) {
	proc, st := statefulProcessor(t, joinSrc("left", "1m", "10m", "0s"), "j")
	v := func(id, ad string, minute int) sideEvent {
		return sideEvent{id: id, ad: ad, left: true, minute: minute}
	}
	c := func(id, ad string, minute int) sideEvent { return sideEvent{id: id, ad: ad, minute: minute} }

	outs, errs := st.joinBatch(t, proc, c("c0", "a", 0), v("v1", "a", 1), v("v2", "b", 1))
	if errs[0] != nil || errs[1] != nil || !slices.Equal(rows(t, outs), []string{"v1,c0"}) {
		t.Fatalf("a click a minute before its view: %v %v, want [v1,c0]", rows(t, outs), errs)
	}
	if o := outs[0]; o.Message.Key != "a" || o.Message.Headers[EventTimeHeader] != "60000" || o.Message.Value["ad"] != "a" {
		t.Fatalf("the match is %q at %q: %v; want key a at its later event's time", o.Message.Key, o.Message.Headers[EventTimeHeader], o.Message.Value)
	}
	// A click 10 minutes after v1 matches it too; v2 has matched nothing, but its span is not over.
	outs, _ = st.joinBatch(t, proc, c("c1", "a", 11))
	if !slices.Equal(rows(t, outs), []string{"v1,c1"}) {
		t.Fatalf("a click within the span: %v, want [v1,c1]", rows(t, outs))
	}
	// Past v2's span (minute 11 plus grace): v2 comes out alone; v1, matched, does not.
	outs, _ = st.joinBatch(t, proc, c("c2", "z", 12))
	if !slices.Equal(rows(t, outs), []string{"v2,<nil>"}) {
		t.Fatalf("past the span: %v, want [v2,<nil>]", rows(t, outs))
	}
	// A click for v1 that comes now is late (dropped and counted), and emits nothing.
	outs, _ = st.joinBatch(t, proc, c("late", "a", 5))
	if len(outs) != 0 || st.late != 1 {
		t.Fatalf("a late click: %v, late %d", rows(t, outs), st.late)
	}
	if got := rows(t, st.end(t, proc)); len(got) != 0 {
		t.Fatalf("at the end: %v, want nothing more (no view is left)", got)
	}
	if n := st.keyCount(t); n != 0 {
		t.Fatalf("%d keys held after the end, want 0", n)
	}
}

// An event past max_per_key is dead-lettered with the reason; the events held go on matching.
func TestAJoinRefusesMoreEventsPerKeyThanItMayHold(t *testing.T) {
	proc, st := statefulProcessor(t, joinSrc("inner", "0s", "1h", "0s"), "j")
	var views []sideEvent
	for i := range 6 {
		views = append(views, sideEvent{id: fmt.Sprint("v", i), ad: "a", left: true, minute: i})
	}
	_, errs := st.joinBatch(t, proc, views...)
	if errs[5] == nil || !IsPermanent(errs[5]) || !strings.Contains(errs[5].Error(), "max_per_key = 5") {
		t.Fatalf("the sixth view: %v, want a permanent error naming max_per_key", errs[5])
	}
	outs, _ := st.joinBatch(t, proc, sideEvent{id: "c", ad: "a", minute: 6})
	if len(outs) != 5 {
		t.Fatalf("a click matched %d views, want the 5 held", len(outs))
	}
}

// The stage's results equal a reference join's, for each type, on random views and clicks that
// arrive out of order, in random batches: what matches depends on event times only.
func TestAJoinEqualsTheReferenceOnRandomEvents(t *testing.T) {
	for seed := range uint64(150) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			typ := []string{"inner", "left", "outer"}[seed%3]
			before, after, grace := rng.IntN(4), rng.IntN(6), rng.IntN(4) // minutes
			src := strings.Replace(joinSrc(typ, fmt.Sprintf("%dm", before), fmt.Sprintf("%dm", after), fmt.Sprintf("%dm", grace)),
				"max_per_key = 5", "max_per_key = 1000", 1)
			proc, st := statefulProcessor(t, src, "j")
			var events []sideEvent
			for i := range 40 + rng.IntN(60) {
				events = append(events, sideEvent{id: fmt.Sprint("e", i), ad: fmt.Sprint("a", rng.IntN(3)), left: rng.IntN(2) == 0, minute: i/4 + rng.IntN(6)})
			}
			rng.Shuffle(len(events), func(i, j int) {
				if abs(i-j) < 5 {
					events[i], events[j] = events[j], events[i]
				}
			})
			var outs []Output
			for rest := events; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(6))
				o, errs := st.joinBatch(t, proc, rest[:n]...)
				for _, err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
				outs = append(outs, o...)
				rest = rest[n:]
			}
			outs = append(outs, st.end(t, proc)...)
			want := referenceJoin(events, typ, before, after, grace)
			if got := rows(t, outs); !slices.Equal(got, want) {
				t.Fatalf("%s join, before %d, after %d, grace %d:\n%v\nwant\n%v", typ, before, after, grace, got, want)
			}
			if n := st.keyCount(t); n != 0 {
				t.Fatalf("%d keys held after the end, want 0", n)
			}
		})
	}
}

// referenceJoin computes the rows another way: an event is late when it is more than grace minutes
// behind the latest event time that arrived before it or with it; of the others, every pair of a
// view and a click of one ad with the click from before minutes before the view to after minutes
// after it is a row, and so, by the type, is each view (left, outer) or click (outer) in none.
func referenceJoin(arrivals []sideEvent, typ string, before, after, grace int) []string {
	var kept []sideEvent
	latest := 0
	for _, e := range arrivals {
		latest = max(latest, e.minute)
		if e.minute+grace >= latest {
			kept = append(kept, e)
		}
	}
	var out []string
	matched := map[string]bool{}
	for _, l := range kept {
		for _, r := range kept {
			if l.left && !r.left && l.ad == r.ad && r.minute >= l.minute-before && r.minute <= l.minute+after {
				out = append(out, l.id+","+r.id)
				matched[l.id], matched[r.id] = true, true
			}
		}
	}
	for _, e := range kept {
		switch {
		case matched[e.id]:
		case e.left && typ != "inner":
			out = append(out, e.id+",<nil>")
		case !e.left && typ == "outer":
			out = append(out, "<nil>,"+e.id)
		}
	}
	sort.Strings(out)
	return out
}

// The kind's located errors: an input of its own, a side missing, a negative span, a select that
// names neither side (with the side it may mean).
func TestAJoinRefusesWhatCannotJoin(t *testing.T) {
	sides := `left {
    input = topic.in
    key   = msg.k
  }
  right {
    input = topic.in
    key   = msg.k
  }`
	for _, c := range []struct{ name, body, want string }{
		{"an input of its own", "input = topic.in\n" + sides, `"input"`},
		{"no right side", "left {\n input = topic.in\n key = msg.k\n}", "Missing right block"},
		{"a side without a key", "left {\n input = topic.in\n}\nright {\n input = topic.in\n key = msg.k\n}", `"key"`},
		{"a negative span", sides + "\nafter = \"-1m\"", "negative"},
		{"a select of neither side", sides + "\nselect = { x = rihgt.id }", `"right"`},
		{"an unknown type", sides + "\ntype = \"cross\"", "cross"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := "stage \"j\" {\n  kind   = \"join\"\n  output = topic.a\n  " + c.body + "\n}\n" + sinkA
			diags := compileDiags(t, src)
			if !strings.Contains(diags, c.want) {
				t.Fatalf("diagnostics:\n%s\nwant %q", diags, c.want)
			}
		})
	}
}
