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

// A join of views (left) and clicks (right) by ad: these tests compute the rows it must emit from
// what they wrote, and compare, row by row. The data has matches, views that no click matches,
// clicks outside every view's span, and late clicks and views.

// joinPipeline is a left join of views (3 partitions, keyed by view id) and clicks (2 partitions,
// keyed by click id) by ad, a click from 1 minute before its view to 10 minutes after it, with 30
// seconds of grace; late events go to the late stream.
func joinPipeline(prefix, delivery string) string {
	keyPrefix := ""
	if prefix != "" {
		keyPrefix = fmt.Sprintf("key_prefix = %q", prefix)
	}
	return fmt.Sprintf(`
pipeline "joins" {
  %s
  delivery = %q
}
variable "out" {}
variable "late" {}
topic "views" {
  partitions = 3
  key        = msg.view_id
}
topic "clicks" {
  partitions = 2
  key        = msg.click_id
}
topic "late" {}
stage "clicked" {
  kind = "join"
  type = "left"
  left {
    input      = topic.views
    key        = msg.ad
    event_time = msg.ts
  }
  right {
    input      = topic.clicks
    key        = msg.ad
    event_time = msg.ts
  }
  before = "1m"
  after  = "10m"
  grace  = "30s"
  late   = topic.late
  select = { ad = left.ad, view = left.view_id, click = right.click_id }
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.clicked
  stream = var.out
}
sink "late" {
  kind   = "redis_stream"
  input  = topic.late
  stream = var.late
}
`, keyPrefix, delivery)
}

const (
	joinBefore = int64(time.Minute / time.Millisecond)
	joinAfter  = int64(10 * time.Minute / time.Millisecond)
	joinGrace  = int64(30 * time.Second / time.Millisecond)
)

// joinEvent is a view or a click the test writes.
type joinEvent struct {
	id, ad string
	view   bool
	ts     int64 // Unix ms
}

func (e joinEvent) payload() string {
	if e.view {
		return fmt.Sprintf(`{"view_id":%q,"ad":%q,"ts":%d}`, e.id, e.ad, e.ts)
	}
	return fmt.Sprintf(`{"click_id":%q,"ad":%q,"ts":%d}`, e.id, e.ad, e.ts)
}

// joinData makes views and clicks of ads, in the order they are written: views a second apart with
// up to 20 seconds of disorder; clicks of a view from 2 minutes before it to 12 minutes after (so
// some outside its span), in the order of their times with up to 20 seconds of disorder; and one
// click in 25 and one view in 50 from an hour before (late).
func joinData(seed uint64, views, clicks, ads int) (vs, cs []joinEvent) {
	rng := rand.New(rand.NewPCG(seed, 3))
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for i := range views {
		ts := base + int64(i)*1000 + rng.Int64N(20000)
		if i%50 == 49 {
			ts -= int64(time.Hour / time.Millisecond)
		}
		vs = append(vs, joinEvent{id: fmt.Sprint("v", i), ad: fmt.Sprint("ad", rng.IntN(ads)), view: true, ts: ts})
	}
	for i := range clicks {
		v := vs[min(len(vs)-1, i*views/clicks)]
		ts := v.ts - 2*60000 + rng.Int64N(14*60000)
		cs = append(cs, joinEvent{ad: v.ad, ts: ts})
	}
	// Clicks are written about in the order they happen: by time, but for a few seconds of disorder.
	sort.Slice(cs, func(i, j int) bool { return cs[i].ts < cs[j].ts })
	for i := range cs {
		cs[i].id = fmt.Sprint("c", i)
		cs[i].ts += rng.Int64N(20000)
		if i%25 == 24 {
			cs[i].ts -= int64(time.Hour / time.Millisecond)
		}
	}
	return vs, cs
}

// referenceJoinRows computes the rows and the late events another way. An event is late when it
// is more than grace behind the latest event time written before it to its partition of its topic
// (where its side measures the watermark, which it carries to the join). Of the others, each view
// and click of one ad with the click from before the view's time less before to its time plus
// after is a row "view,click"; each view in none is a row "view,<nil>".
func referenceJoinRows(vs, cs []joinEvent) (rows, late []string) {
	keep := func(events []joinEvent, partitions int) []joinEvent {
		latest := make([]int64, partitions)
		var kept []joinEvent
		for _, e := range events {
			p := redis.Partition(e.id, partitions)
			latest[p] = max(latest[p], e.ts)
			if e.ts+joinGrace < latest[p] {
				late = append(late, e.id)
				continue
			}
			kept = append(kept, e)
		}
		return kept
	}
	views, clicks := keep(vs, 3), keep(cs, 2)
	byAd := map[string][]joinEvent{}
	for _, c := range clicks {
		byAd[c.ad] = append(byAd[c.ad], c)
	}
	for _, v := range views {
		matched := false
		for _, c := range byAd[v.ad] {
			if c.ts >= v.ts-joinBefore && c.ts <= v.ts+joinAfter {
				rows = append(rows, v.id+","+c.id)
				matched = true
			}
		}
		if !matched {
			rows = append(rows, v.id+",<nil>")
		}
	}
	sort.Strings(rows)
	sort.Strings(late)
	return rows, late
}

func publishJoinData(t *testing.T, c *redis.Client, plan *flow.Plan, vs, cs []joinEvent) {
	t.Helper()
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for topic, events := range map[string][]joinEvent{"views": vs, "clicks": cs} {
		msgs := make([]stages.Message, 0, len(events))
		for _, e := range events {
			msgs = append(msgs, stages.NewMessage("", []byte(e.payload()), nil))
		}
		if err := pub.PublishBatch(ctx, topic, msgs); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkJoinRows compares the join's output and late stream with the reference, row by row: every
// row exactly once, nothing else.
func checkJoinRows(t *testing.T, c *redis.Client, out, lateStream string, vs, cs []joinEvent) {
	t.Helper()
	wantRows, wantLate := referenceJoinRows(vs, cs)
	var rows, late []string
	ads := map[string]string{}
	for _, e := range append(slices.Clone(vs), cs...) {
		ads[e.id] = e.ad
	}
	for _, m := range streamPayloads(t, c, out) {
		view, _ := m["view"].(string)
		if m["ad"] != ads[view] {
			t.Fatalf("row %v: ad %v, want the view's, %s", m, m["ad"], ads[view])
		}
		rows = append(rows, fmt.Sprintf("%v,%v", m["view"], m["click"]))
	}
	for _, m := range streamPayloads(t, c, lateStream) {
		id, ok := m["view_id"]
		if !ok {
			id = m["click_id"]
		}
		late = append(late, fmt.Sprint(id))
	}
	sort.Strings(rows)
	sort.Strings(late)
	if !slices.Equal(late, wantLate) {
		for _, id := range symmetricDifference(late, wantLate) {
			for _, r := range rows {
				if strings.HasPrefix(r, id+",") || strings.HasSuffix(r, ","+id) {
					t.Logf("%s is a row: %s", id, r)
				}
			}
		}
		t.Fatalf("%d late events, want %d; the first that differs: %s", len(late), len(wantLate), firstDifference(late, wantLate))
	}
	if !slices.Equal(rows, wantRows) {
		t.Fatalf("%d rows, want %d; the first that differs: %s", len(rows), len(wantRows), firstDifference(rows, wantRows))
	}
	matched, alone := 0, 0
	for _, r := range rows {
		if r[len(r)-5:] == "<nil>" {
			alone++
		} else {
			matched++
		}
	}
	if matched == 0 || alone == 0 || len(late) == 0 {
		t.Fatalf("%d matches, %d views alone, %d late: the data tests too little", matched, alone, len(late))
	}
}

// TestJoinJobIsExact joins 2,000 views and 1,200 clicks as a job, on every backend: each row of the
// reference comes out once, each late event goes to the late topic, and nothing else comes out.
func TestJoinJobIsExact(t *testing.T) {
	t.Parallel()
	const views, clicks, ads = 2000, 1200, 150
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			n := prefixes.Add(1)
			out, late := fmt.Sprintf("join-out-%d", n), fmt.Sprintf("join-late-%d", n)
			plan := buildSource(t, joinPipeline("", "at_least_once"), "out="+out, "late="+late)
			vs, cs := joinData(uint64(n), views, clicks, ads)
			publishJoinData(t, c, plan, vs, cs)
			j := runJobWithin(t, c, plan, runtime.Options{}, 5*time.Minute)
			checkJoinRows(t, c, out, late, vs, cs)
			if s := j.node(t, "clicked"); s.In != views+clicks || s.DeadLettered != 0 {
				t.Errorf("join counts %+v", s)
			}
		})
	}
}

// TestJoinExactlyOnceThroughKillCycles runs the join with effectively-once delivery in flowrun
// processes that are killed mid-stream, over and over (10 times; 50 with -soak, on more events),
// then to the end as a job: every row comes out exactly once, and every late event once.
func TestJoinExactlyOnceThroughKillCycles(t *testing.T) {
	t.Parallel()
	views, clicks, ads, cycles := 4000, 2500, 200, 10
	if *soakFlag {
		views, clicks, ads, cycles = 20_000, 12_500, 400, 50
	}
	bin := flowrunBinary(t)
	for _, b := range processBackends {
		t.Run(b.name, func(t *testing.T) {
			urls := b.urls(t)
			c := openURLs(t, urls...)
			prefix := fmt.Sprintf("killjoin-%d", prefixes.Add(1))
			out, late := prefix+":out", prefix+":late"
			path := filepath.Join(t.TempDir(), "joins.hcl")
			writeFile(t, path, joinPipeline(prefix, "effectively_once"))
			vars := []string{"--var", "out=" + out, "--var", "late=" + late}
			plan, _, diags := flow.Build(path, flow.Options{Vars: []string{"out=" + out, "late=" + late}})
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			vs, cs := joinData(uint64(len(prefix)), views, clicks, ads)
			publishJoinData(t, c, plan, vs, cs)
			keys := redis.Keys{Prefix: prefix}
			inputs := keys.Streams("clicked.by_key", 3)
			sides := append(keys.Streams("views", 3), keys.Streams("clicks", 2)...)
			backlog := func() int {
				n := 0
				for _, s := range inputs {
					n += int(backlogOf(t, c, s, "clicked"))
				}
				for i, s := range sides {
					group := "clicked.left"
					if i >= 3 {
						group = "clicked.right"
					}
					n += int(backlogOf(t, c, s, group))
				}
				return n
			}
			// Small batches: a process commits often, so that each cycle kills it with some done and some in flight.
			args := append(append([]string{"run", path, "--lease-ttl", "300ms", "--batch-size", "20"}, vars...), redisArgs(urls)...)
			var logs []string
			midBatch, cycle := 0, 0
			for ; cycle < cycles && backlog() > (views+clicks)/10; cycle++ {
				// The kill point: a random number more events taken in, polled without pause.
				target := backlog() - 50 - rand.IntN((views+clicks)/(4*cycles))
				p := startBinary(t, bin, args...)
				for deadline := time.Now().Add(time.Minute); backlog() > target || mostDelivered(t, c, "clicked", inputs...) > 2; {
					if time.Now().After(deadline) {
						t.Fatalf("cycle %d: the backlog did not come down to %d in a minute", cycle, target)
					}
				}
				p.kill(t)
				if pendingFor(t, c, keys, "clicked.by_key", 3, "clicked", "") > 0 {
					midBatch++
				}
				logs = append(logs, p.log.String())
			}
			last := startBinary(t, bin, append(args, "--until-drained")...)
			if err := waitProcess(t, last); err != nil {
				t.Fatalf("the last process, run as a job to the end: %v\n%s", err, last.log.String())
			}
			checkJoinRows(t, c, out, late, vs, cs)
			if cycle < 3 || midBatch == 0 {
				t.Errorf("%d SIGKILL cycles, %d with batches in flight: too few to test anything", cycle, midBatch)
			}
			t.Logf("%d SIGKILL cycles, %d with batches in flight, %d leases lost", cycle, midBatch, leaseLosses(append(logs, last.log.String())...))
		})
	}
}

// firstDifference says where two sorted lists first differ.
func firstDifference(got, want []string) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("%s, want %s", got[i], want[i])
		}
	}
	if len(got) > len(want) {
		return fmt.Sprintf("%s, want nothing more", got[len(want)])
	}
	if len(want) > len(got) {
		return fmt.Sprintf("nothing more, want %s", want[len(got)])
	}
	return "none"
}

// symmetricDifference lists what is in one of two lists but not the other.
func symmetricDifference(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, x)
		}
	}
	return out
}
