package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/flowtest"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The watermark of each stateful stage, per partition of its input, as /api/graph, the live page
// and the metric flowrun_watermark_lag_seconds show it. A dedupe and an aggregate
// (testdata/marks.hcl) read topics that only the test writes, so that each measures its own
// watermark per partition: the latest event time read there. Orders go to both partitions of
// theirs, clicks to partition 0 alone: partition 1 of clicks has no watermark. The service runs on
// a virtual clock that moves only when the test moves it (a millisecond at a time, for the polls of
// the streams), so that every lag is known.

// marks is the running service of testdata/marks.hcl with what it was sent.
type marks struct {
	s      *service
	c      *redis.Client
	plan   *flow.Plan
	clock  *flowtest.Clock
	reader *sdkmetric.ManualReader
	// want is each stateful stage's watermark per partition of its input (Unix ms): the latest
	// event time sent there; a partition that was sent nothing is absent.
	want map[string]map[int]int64
	// topics names each stateful stage's input.
	topics map[string]string
}

// keyIn returns the first of prefix0, prefix1, ... that a topic of n partitions puts in partition p.
func keyIn(prefix string, p, n int) string {
	for i := 0; ; i++ {
		if k := prefix + itoa(int64(i)); redis.Partition(k, n) == p {
			return k
		}
	}
}

// startMarks runs testdata/marks.hcl as a service, sends it its orders and clicks, and waits until a poll
// of the streams has read every watermark that they make.
func startMarks(t *testing.T) *marks {
	t.Helper()
	ctx := context.Background()
	m := &marks{c: server.open(t), plan: buildTestdata(t, "marks.hcl"),
		clock:  flowtest.NewClock(flowtest.Epoch.Add(12 * time.Hour)),
		reader: sdkmetric.NewManualReader(),
		topics: map[string]string{"once": "orders", "per_minute": "clicks"}}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(m.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m.s = startService(t, m.c, m.plan, runtime.Options{Clock: m.clock, PollInterval: time.Millisecond, MeterProvider: mp})

	now := m.clock.Now()
	at := func(before time.Duration) int64 { return now.Add(-before).UnixMilli() }
	type event struct {
		topic, payload string
	}
	var events []event
	// Orders: in partition 0 the latest is 45s before the clock, in partition 1 20s; each partition
	// also gets an earlier one after its latest (a watermark never goes back).
	o0, o1, o2, o3 := keyIn("o", 0, 2), keyIn("p", 0, 2), keyIn("o", 1, 2), keyIn("p", 1, 2)
	for _, e := range []struct {
		id     string
		before time.Duration
	}{{o0, 90 * time.Second}, {o1, 45 * time.Second}, {o0, 50 * time.Second}, {o2, 20 * time.Second}, {o3, 80 * time.Second}} {
		events = append(events, event{"orders", fmt.Sprintf(`{"id":%q,"at":%d}`, e.id, at(e.before))})
	}
	// Clicks, of two users whose keys are in partition 0: the latest 3m5s before the clock.
	u0, u1 := keyIn("u", 0, 2), keyIn("v", 0, 2)
	for _, e := range []struct {
		user   string
		before time.Duration
	}{{u0, 4 * time.Minute}, {u1, 185 * time.Second}, {u0, 200 * time.Second}} {
		events = append(events, event{"clicks", fmt.Sprintf(`{"user":%q,"at":%d}`, e.user, at(e.before))})
	}
	m.want = map[string]map[int]int64{
		"once":       {0: at(45 * time.Second), 1: at(20 * time.Second)},
		"per_minute": {0: at(185 * time.Second)},
	}

	pub, err := runtime.NewPublisher(m.c, m.plan)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if err := pub.Publish(ctx, e.topic, stages.NewMessage("", []byte(e.payload), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a poll to read every watermark that the events make", func() bool {
		polled := map[string]map[int]int64{}
		for _, p := range m.s.rt.Snapshot().Partitions {
			if !p.Watermark.IsZero() {
				if polled[p.Node] == nil {
					polled[p.Node] = map[int]int64{}
				}
				polled[p.Node][p.Partition] = p.Watermark.UnixMilli()
			}
		}
		if fmt.Sprint(polled) == fmt.Sprint(m.want) {
			return true
		}
		m.clock.AdvanceTo(m.clock.Now().Add(time.Millisecond)) // the next poll
		return false
	})
	return m
}

// stored reads a stage's watermark in a partition from its state hash, as the stage committed it.
func (m *marks) stored(t *testing.T, stage string, p int) (int64, bool) {
	t.Helper()
	hash := redis.Keys{Prefix: m.plan.KeyPrefix}.State(m.topics[stage], p, stage)
	v, err := m.c.Universal().HGet(context.Background(), hash, redis.WatermarkField).Int64()
	if err != nil {
		return 0, false
	}
	return v, true
}

type watermarkDoc struct {
	Taken time.Time `json:"taken"`
	Nodes []struct {
		ID        string `json:"id"`
		Watermark *struct {
			Topic      string     `json:"topic"`
			Least      *time.Time `json:"least"`
			LagSeconds *float64   `json:"lag_seconds"`
			Partitions []struct {
				Partition  int        `json:"partition"`
				Watermark  *time.Time `json:"watermark"`
				LagSeconds *float64   `json:"lag_seconds"`
			} `json:"partitions"`
		} `json:"watermark"`
	} `json:"nodes"`
}

// TestGraphShowsWatermarks: /api/graph carries each stateful stage's watermark per partition of its
// input, equal to what its state hash holds and to the latest event time sent there, with its lag
// behind the runtime's clock; the least of them and its lag; null for a partition that has none.
// Other nodes have no watermark.
func TestGraphShowsWatermarks(t *testing.T) {
	m := startMarks(t)
	code, body := get(t, web.NewHandler(m.s.rt, nil), "/api/graph")
	var g watermarkDoc
	if err := json.Unmarshal([]byte(body), &g); code != http.StatusOK || err != nil {
		t.Fatalf("/api/graph: %d %v\n%s", code, err, body)
	}
	if now := m.clock.Now(); !g.Taken.Equal(now) {
		t.Errorf("taken %s, the clock %s", g.Taken, now)
	}
	lagOf := func(ms int64) float64 { return math.Round(g.Taken.Sub(time.UnixMilli(ms)).Seconds()*1000) / 1000 }
	seen := map[string]bool{}
	for _, n := range g.Nodes {
		stage := strings.TrimPrefix(n.ID, "stage.")
		want, stateful := m.want[stage]
		if !stateful {
			if n.Watermark != nil {
				t.Errorf("%s has a watermark: %+v", n.ID, *n.Watermark)
			}
			continue
		}
		seen[stage] = true
		w := n.Watermark
		if w == nil || w.Topic != m.topics[stage] || len(w.Partitions) != 2 {
			t.Fatalf("%s: watermark %+v, want one for each partition of topic %s", n.ID, w, m.topics[stage])
		}
		least := int64(math.MaxInt64)
		for i, p := range w.Partitions {
			stored, found := m.stored(t, stage, i)
			wantAt, sent := want[i]
			switch {
			case p.Partition != i:
				t.Errorf("%s: partition %d listed as %d", n.ID, i, p.Partition)
			case !sent:
				if p.Watermark != nil || p.LagSeconds != nil || found {
					t.Errorf("%s[%d] was sent nothing, yet shows watermark %s, lag %s (stored: %v)", n.ID, i, shown(p.Watermark), shown(p.LagSeconds), found)
				}
			case p.Watermark == nil || p.LagSeconds == nil:
				t.Errorf("%s[%d] shows no watermark, want %d", n.ID, i, wantAt)
			default:
				if got := p.Watermark.UnixMilli(); got != wantAt || !found || stored != got {
					t.Errorf("%s[%d]: watermark %d, stored %d (found %v), want the latest event time sent, %d", n.ID, i, got, stored, found, wantAt)
				}
				if *p.LagSeconds != lagOf(wantAt) {
					t.Errorf("%s[%d]: lag %v s, want the clock less the watermark, %v s", n.ID, i, *p.LagSeconds, lagOf(wantAt))
				}
				least = min(least, wantAt)
			}
		}
		if w.Least == nil || w.Least.UnixMilli() != least || w.LagSeconds == nil || *w.LagSeconds != lagOf(least) {
			t.Errorf("%s: least %s, lag %s; want %d, %v s", n.ID, shown(w.Least), shown(w.LagSeconds), least, lagOf(least))
		}
	}
	if len(seen) != len(m.want) {
		t.Errorf("/api/graph shows the watermarks of %v, want those of %v", seen, m.want)
	}
}

// TestWatermarkLagMetric: flowrun.watermark.lag (flowrun_watermark_lag_seconds in Prometheus) is,
// per stateful stage and input partition, the runtime's clock less the stage's watermark there,
// and nothing for a partition without one or for a stage that keeps no state.
func TestWatermarkLagMetric(t *testing.T) {
	m := startMarks(t)
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	now := m.clock.Now()
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, metric := range sm.Metrics {
			if metric.Name != "flowrun.watermark.lag" {
				continue
			}
			if metric.Unit != "s" {
				t.Errorf("unit %q, want s", metric.Unit)
			}
			gauge, ok := metric.Data.(metricdata.Gauge[float64])
			if !ok {
				t.Fatalf("flowrun.watermark.lag is a %T, want a gauge of float64", metric.Data)
			}
			for _, dp := range gauge.DataPoints {
				topic, _ := dp.Attributes.Value(attribute.Key("messaging.destination.name"))
				part, _ := dp.Attributes.Value(attribute.Key("messaging.destination.partition.id"))
				got[node(dp.Attributes)+" "+topic.AsString()+"["+part.AsString()+"]"] = dp.Value
			}
		}
	}
	want := map[string]float64{}
	for stage, parts := range m.want {
		for p, at := range parts {
			want[stage+" "+m.topics[stage]+"["+itoa(int64(p))+"]"] = now.Sub(time.UnixMilli(at)).Seconds()
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("flowrun.watermark.lag at %s:\n got %v\nwant %v", now, got, want)
	}
}

// TestPageShowsWatermarks loads the live page in headless Chromium: each stateful stage shows the
// least of its partitions' watermarks (the time of day in UTC, on the clock's day) and its lag behind
// the clock, in its box and its card, and lists every partition's in its title; a stage that keeps
// no state shows none.
func TestPageShowsWatermarks(t *testing.T) {
	chromium := findChromium(t)
	m := startMarks(t)
	site := httptest.NewServer(web.NewHandler(m.s.rt, nil))
	defer site.Close()
	dom := parseDOM(dumpDOM(t, chromium, site.URL+"/"))
	if state := dom.find("body", "").attrs["data-state"]; state != "ok" {
		t.Fatalf("the page did not draw the graph (data-state %q):\n%s", state, dom.raw)
	}
	now := m.clock.Now()
	for stage, parts := range m.want {
		n := dom.node(t, "stage."+stage)
		least := int64(math.MaxInt64)
		for _, at := range parts {
			least = min(least, at)
		}
		wantAt := time.UnixMilli(least).UTC().Format("15:04:05")
		wantLag := pageDuration(now.Sub(time.UnixMilli(least)))
		if at, lag := n.field("watermark").text, n.field("watermark_lag").text; at != wantAt || lag != wantLag {
			t.Errorf("stage.%s shows watermark %q, lag %q; want %q, %q", stage, at, lag, wantAt, wantLag)
		}
		// Its card (the page on a phone) shows the same.
		card := dom.card(t, "stage."+stage)
		if at, lag := card.all("data-card-field", "watermark"), card.all("data-card-field", "watermark_lag"); len(at) != 1 || len(lag) != 1 ||
			at[0].text != wantAt || lag[0].text != wantLag {
			t.Errorf("stage.%s's card shows watermark %+v, lag %+v; want %q, %q", stage, at, lag, wantAt, wantLag)
		}
		var title []domElement
		for _, e := range n.inside {
			if e.tag == "title" {
				title = append(title, e)
			}
		}
		if len(title) != 1 {
			t.Fatalf("stage.%s has %d titles", stage, len(title))
		}
		for p := 0; p < 2; p++ {
			line := fmt.Sprintf("p%d  none yet", p)
			if at, ok := parts[p]; ok {
				line = fmt.Sprintf("p%d  %s, lag %s", p, time.UnixMilli(at).UTC().Format("2006-01-02T15:04:05.000Z"),
					pageDuration(now.Sub(time.UnixMilli(at))))
			}
			if !strings.Contains(title[0].text, line) {
				t.Errorf("stage.%s's title lacks %q:\n%s", stage, line, title[0].text)
			}
		}
	}
	if shown := dom.node(t, "stage.shown"); len(shown.all("data-field", "watermark")) != 0 {
		t.Errorf("the map stage shows a watermark: %+v", shown)
	}
	if shown := dom.card(t, "stage.shown"); len(shown.all("data-card-field", "watermark")) != 0 {
		t.Errorf("the map stage's card shows a watermark: %+v", shown)
	}
}

// shown formats what a pointer points at; "null" for nil.
func shown[T any](v *T) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

// pageDuration is how the page writes a lag under an hour: 45s, 3m 5s.
func pageDuration(d time.Duration) string {
	s := int(d.Seconds())
	if s < 60 {
		return itoa(int64(s)) + "s"
	}
	return fmt.Sprintf("%dm %ds", s/60, s%60)
}
