package web_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
)

// The live page in headless Chromium, at a laptop's size (1280x800) and a phone's (390x844), on
// the fanout example (11 nodes) and on a pipeline of 30 nodes made here: at the laptop's size the
// whole graph is in the window, with its sparklines and last dead letters, and zooms and pans; at
// the phone's, a list of cards with the same figures fits the width, in a readable font. Neither
// scrolls sideways. The pipeline behind the page is a still one (busy, below): the page draws what
// /api/graph says, whatever runs it.

// busy is a pipeline whose every node has counters, a lag, five dead letters and 15 minutes of
// history, the same at every request.
type busy struct {
	plan *flow.Plan
	snap runtime.Snapshot
	hist runtime.History
}

func (b busy) Plan() *flow.Plan           { return b.plan }
func (b busy) Snapshot() runtime.Snapshot { return b.snap }
func (b busy) Ready() error               { return nil }
func (b busy) History() runtime.History   { return b.hist }

// longReason is a dead letter's reason with no space to break it at: it must wrap in its card.
var longReason = "field_" + strings.Repeat("x", 200) + " is missing"

func newBusy(plan *flow.Plan) busy {
	taken := time.Date(2026, 3, 2, 10, 15, 0, 0, time.UTC)
	b := busy{plan: plan, snap: runtime.Snapshot{Taken: taken, Polled: taken, Leases: 4, Balanced: true, DeadLetters: map[string]int64{}},
		hist: runtime.History{Step: 10 * time.Second, Nodes: map[string]runtime.NodeHistory{}}}
	for i := range 90 {
		b.hist.Times = append(b.hist.Times, taken.Add(time.Duration(i-89)*10*time.Second))
	}
	for i, n := range plan.Graph().Nodes {
		if n.Type == "topic" {
			continue
		}
		summary := runtime.NodeSummary{Name: n.Name, Type: n.Type, Kind: n.Kind, In: 120000, Out: 119000, DeadLettered: 1000,
			FailedAttempts: 1000, Written: 119000}
		for d := range 5 {
			reason := fmt.Sprintf("%s: reason %d", n.Name, d)
			if d == 0 {
				reason = longReason
			}
			summary.LastDeadLetters = append(summary.LastDeadLetters, runtime.RecentDeadLetter{At: taken.Add(-time.Duration(d) * time.Minute), Reason: reason})
		}
		b.snap.Nodes = append(b.snap.Nodes, summary)
		b.snap.DeadLetters[n.Name] = 1000
		var h runtime.NodeHistory
		for p := range 90 {
			h.Rate = append(h.Rate, float64((p*7+i)%40))
			h.Lag = append(h.Lag, int64((p*13+i)%500))
		}
		b.hist.Nodes[n.Name] = h
	}
	for _, t := range plan.Topics {
		for _, e := range plan.Graph().Edges {
			if e.From == "topic."+t.Name && e.Kind == flow.EdgeReads {
				for p := range t.Partitions {
					b.snap.Partitions = append(b.snap.Partitions, runtime.PartitionState{
						Node: strings.SplitN(e.To, ".", 2)[1], Topic: t.Name, Partition: p, Length: 5000, Lag: 40, Pending: 3})
				}
			}
		}
	}
	return b
}

// thirtyNodes writes a pipeline of 30 nodes: a chain of 6 stages deep, with branches off it, so
// that the graph is both long (13 layers) and wide.
func thirtyNodes(t *testing.T) *flow.Plan {
	t.Helper()
	var b strings.Builder
	b.WriteString(`pipeline "thirty" {}
source "in" {
  kind     = "generate"
  count    = 10
  output   = topic.t0
  template = { user = "u${index}", at = index }
}
`)
	// The chain: t0 -> s1 -> t1 -> s2 -> ... -> t5 -> s6 -> sink end.
	for i := 0; i <= 5; i++ {
		fmt.Fprintf(&b, "topic \"t%d\" {\n  partitions = 4\n  key = msg.user\n}\n", i)
	}
	for i := 1; i <= 6; i++ {
		out := ""
		if i < 6 {
			out = fmt.Sprintf("  output = topic.t%d\n", i)
		}
		fmt.Fprintf(&b, "stage \"s%d\" {\n  kind  = \"map\"\n  input = topic.t%d\n%s  set   = { step = %d }\n}\n", i, i-1, out, i)
	}
	b.WriteString("sink \"end\" {\n  kind  = \"stdout\"\n  input = stage.s6\n}\n")
	// Branches: off t1 and t3, a filter and a sink each; off t2, an aggregate and a sink.
	for _, from := range []int{1, 3} {
		for j := range 2 {
			fmt.Fprintf(&b, "stage \"f%d_%d\" {\n  kind  = \"filter\"\n  input = topic.t%d\n  where = msg.at > %d\n}\n", from, j, from, j)
			fmt.Fprintf(&b, "sink \"out%d_%d\" {\n  kind  = \"stdout\"\n  input = stage.f%d_%d\n}\n", from, j, from, j)
		}
	}
	b.WriteString(`stage "per_minute" {
  kind       = "aggregate"
  input      = topic.t2
  group_by   = msg.user
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "counts" {
  kind  = "stdout"
  input = stage.per_minute
}
stage "once" {
  kind   = "dedupe"
  input  = topic.t4
  key    = msg.user
  within = "1h"
}
sink "unique" {
  kind  = "stdout"
  input = stage.once
}
`)
	// 1 source, 6 topics, 6 + 4 + 2 stages, 1 + 4 + 2 sinks: 26. Four more: a map and a sink off t5,
	// twice.
	for j := range 2 {
		fmt.Fprintf(&b, "stage \"late%d\" {\n  kind  = \"map\"\n  input = topic.t5\n  set   = { j = %d }\n}\n", j, j)
		fmt.Fprintf(&b, "sink \"late_out%d\" {\n  kind  = \"stdout\"\n  input = stage.late%d\n}\n", j, j)
	}
	path := filepath.Join(t.TempDir(), "thirty.hcl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	plan, _, diags := flow.Build(path, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if n := len(plan.Graph().Nodes); n != 30 {
		t.Fatalf("the generated pipeline has %d nodes, want 30", n)
	}
	return plan
}

// pageMeasures is what the page shows, as the browser laid it out.
type pageMeasures struct {
	InnerWidth, InnerHeight, ScrollWidth float64
	GraphShown                           bool
	Nodes                                []struct {
		ID             string
		Box            box
		DrawnSparks    int
		LastDeadLetter string
		ReasonsInTitle int
	}
	Cards []struct {
		ID          string
		Type        string
		Box         box
		FontSize    float64
		DrawnSparks int
		Reasons     []string
		Overflowing []string
	}
	Buttons []string
}

type box struct{ Left, Top, Right, Bottom float64 }

func (b box) String() string {
	return fmt.Sprintf("(%.0f,%.0f)-(%.0f,%.0f)", b.Left, b.Top, b.Right, b.Bottom)
}

const measureScript = `(() => {
  const box = el => { const r = el.getBoundingClientRect(); return {Left: r.left, Top: r.top, Right: r.right, Bottom: r.bottom}; };
  const drawn = el => [...el.querySelectorAll('path.spark')].filter(p => /^M/.test(p.getAttribute('d') || '')).length;
  return {
    InnerWidth: innerWidth, InnerHeight: innerHeight, ScrollWidth: document.documentElement.scrollWidth,
    GraphShown: document.getElementById('graph').getBoundingClientRect().width > 0,
    Nodes: [...document.querySelectorAll('#graph g.node')].map(g => ({
      ID: g.dataset.node, Box: box(g.querySelector('.box')), DrawnSparks: drawn(g),
      LastDeadLetter: (g.querySelector('[data-field="last_dead_letter"]') || {}).textContent || '',
      ReasonsInTitle: (g.querySelector('title').textContent.match(/\n  \d{4}-\d\d-\d\dT/g) || []).length,
    })),
    Cards: [...document.querySelectorAll('#cards .card')].map(c => ({
      ID: c.dataset.card, Type: c.classList[1], Box: box(c), FontSize: parseFloat(getComputedStyle(c.querySelector('dd') || c).fontSize),
      DrawnSparks: drawn(c), Reasons: [...c.querySelectorAll('.reasons li')].map(li => li.textContent),
      Overflowing: [...c.querySelectorAll('*')].filter(e => e.getBoundingClientRect().right > c.getBoundingClientRect().right + 0.5).map(e => e.tagName + ' ' + e.textContent.slice(0, 40)),
    })),
    Buttons: [...document.querySelectorAll('button, input, form, a[href]')].map(b => b.id || b.tagName),
  };
})()`

// browser starts headless Chromium for the test, or skips it when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		path, err = exec.LookPath("chromium-browser")
	}
	if err != nil {
		if os.Getenv("FLOWRUN_REQUIRE_TOOLS") != "" {
			t.Fatal("Chromium is not installed: apt-get install chromium chromium-driver")
		}
		t.Skip("Chromium is not installed (apt-get install chromium chromium-driver)")
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true))
	ctx, cancel := chromedp.NewContext(alloc)
	// The deadline only keeps a broken browser from hanging the test.
	ctx, cancelTimeout := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	return ctx
}

// open loads the page at a size (a phone's is a mobile viewport, at 3 device pixels per CSS
// pixel) and waits until it has drawn the graph.
func open(t *testing.T, ctx context.Context, url string, width, height int64, phone bool) {
	t.Helper()
	size := chromedp.EmulateViewport(width, height)
	if phone {
		size = chromedp.EmulateViewport(width, height, chromedp.EmulateScale(3), chromedp.EmulateMobile)
	}
	if err := chromedp.Do(ctx, size); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.body.dataset.state === 'ok'`)); err != nil {
		t.Fatalf("the page did not draw the graph: %v", err)
	}
}

func measure(t *testing.T, ctx context.Context) pageMeasures {
	t.Helper()
	m, err := chromedp.Run(ctx, chromedp.Evaluate[pageMeasures](measureScript))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// screenshot saves what the browser shows when FLOWRUN_PAGE_SCREENSHOTS names a directory, to look
// at.
func screenshot(t *testing.T, ctx context.Context, name string) {
	dir := os.Getenv("FLOWRUN_PAGE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	}
	if err != nil {
		t.Error(err)
	}
}

func TestPageFitsTheWindow(t *testing.T) {
	ctx := browser(t)
	fanout, _, diags := flow.Build(filepath.Join("..", "..", "examples", "pipelines", "fanout"), flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if n := len(fanout.Graph().Nodes); n != 11 {
		t.Fatalf("the fanout example has %d nodes, want 11", n)
	}
	for _, plan := range []*flow.Plan{fanout, thirtyNodes(t)} {
		name := plan.Name
		site := httptest.NewServer(web.NewHandler(newBusy(plan), nil))
		t.Cleanup(site.Close)
		nodes := len(plan.Graph().Nodes)

		t.Run(name+"/1280x800", func(t *testing.T) {
			open(t, ctx, site.URL+"/", 1280, 800, false)
			screenshot(t, ctx, name+"-1280x800")
			m := measure(t, ctx)
			if m.InnerWidth != 1280 || m.InnerHeight != 800 || !m.GraphShown {
				t.Fatalf("window %vx%v, graph shown %v; want 1280x800 with the graph", m.InnerWidth, m.InnerHeight, m.GraphShown)
			}
			if m.ScrollWidth > m.InnerWidth {
				t.Errorf("the page is %v px wide in a window of %v: it scrolls sideways", m.ScrollWidth, m.InnerWidth)
			}
			if len(m.Nodes) != nodes {
				t.Fatalf("the graph draws %d nodes, want %d", len(m.Nodes), nodes)
			}
			for _, n := range m.Nodes {
				if b := n.Box; b.Left < 0 || b.Top < 0 || b.Right > m.InnerWidth || b.Bottom > m.InnerHeight || b.Right <= b.Left {
					t.Errorf("%s is drawn at %s, outside the window (0,0)-(1280,800)", n.ID, b)
				}
				if strings.HasPrefix(n.ID, "topic.") {
					continue
				}
				if n.DrawnSparks != 2 || n.ReasonsInTitle != 5 || !strings.HasPrefix(n.LastDeadLetter, "last: field_xxx") {
					t.Errorf("%s draws %d sparklines, %d dead letters in its title, the last %q; want 2, 5 and the long reason",
						n.ID, n.DrawnSparks, n.ReasonsInTitle, n.LastDeadLetter)
				}
			}
			for _, b := range m.Buttons {
				if b != "zoom-in" && b != "zoom-out" && b != "zoom-fit" {
					t.Errorf("the page has a control %s: it only reads, and only zooms", b)
				}
			}
		})

		t.Run(name+"/390x844", func(t *testing.T) {
			open(t, ctx, site.URL+"/", 390, 844, true)
			screenshot(t, ctx, name+"-390x844")
			m := measure(t, ctx)
			if m.InnerWidth != 390 || m.GraphShown {
				t.Fatalf("window %v wide, graph shown %v; want 390 and the list alone", m.InnerWidth, m.GraphShown)
			}
			if m.ScrollWidth > m.InnerWidth {
				t.Errorf("the page is %v px wide in a window of %v: it scrolls sideways", m.ScrollWidth, m.InnerWidth)
			}
			if len(m.Cards) != nodes {
				t.Fatalf("the list has %d cards, want %d", len(m.Cards), nodes)
			}
			for _, c := range m.Cards {
				if b := c.Box; b.Left < 0 || b.Right > m.InnerWidth || b.Right-b.Left < 300 {
					t.Errorf("%s's card is at %s: want it across the window's 390 px", c.ID, b)
				}
				if c.FontSize < 12 {
					t.Errorf("%s's figures are %v px: too small to read", c.ID, c.FontSize)
				}
				if len(c.Overflowing) > 0 {
					t.Errorf("%s's card overflows: %v", c.ID, c.Overflowing)
				}
				if c.Type == "topic" {
					continue
				}
				if c.DrawnSparks != 2 || len(c.Reasons) != 5 || !strings.Contains(c.Reasons[0], longReason) {
					t.Errorf("%s's card draws %d sparklines and lists %q; want 2 and five dead letters, the long reason first",
						c.ID, c.DrawnSparks, c.Reasons)
				}
			}
		})
	}
}

// TestPageZoomsAndPans: the buttons, the keys, a drag and the wheel move the graph's view, and fit
// shows the whole graph again.
func TestPageZoomsAndPans(t *testing.T) {
	ctx := browser(t)
	site := httptest.NewServer(web.NewHandler(newBusy(thirtyNodes(t)), nil))
	defer site.Close()
	open(t, ctx, site.URL+"/", 1280, 800, false)
	viewBox := func() [4]float64 {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[4]float64](
			`(() => { const b = document.getElementById('graph').viewBox.baseVal; return [b.x, b.y, b.width, b.height]; })()`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	whole := viewBox()
	if buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#zoom-in, #zoom-out, #zoom-fit').length`)); err != nil || buttons != 3 {
		t.Fatalf("the page has %d of the buttons zoom in, zoom out and fit (%v)", buttons, err)
	}
	if err := chromedp.Do(ctx, chromedp.Click("#zoom-in")); err != nil {
		t.Fatal(err)
	}
	if in := viewBox(); in[2] >= whole[2]*0.7 {
		t.Errorf("zoom in: the view is %v wide, the whole graph %v", in[2], whole[2])
	}
	if err := chromedp.Do(ctx, chromedp.Focus("#graph")); err != nil {
		t.Fatal(err)
	}
	before := viewBox()
	if err := chromedp.Do(ctx, chromedp.KeyEvent(kb.ArrowRight)); err != nil {
		t.Fatal(err)
	}
	if after := viewBox(); after[0] <= before[0] || after[2] != before[2] {
		t.Errorf("the right arrow: view %v, was %v; want it moved right", after, before)
	}
	before = viewBox()
	for _, step := range []chromedp.Action[chromedp.Void]{
		chromedp.MouseEvent(input.DispatchMouseEventTypeMousePressed, 700, 400, chromedp.ButtonLeft),
		chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, 600, 350, chromedp.ButtonLeft),
		chromedp.MouseEvent(input.DispatchMouseEventTypeMouseReleased, 600, 350, chromedp.ButtonLeft),
	} {
		if err := chromedp.Do(ctx, step); err != nil {
			t.Fatal(err)
		}
	}
	if after := viewBox(); after[0] <= before[0] || after[1] <= before[1] || after[2] != before[2] {
		t.Errorf("a drag up and left: view %v, was %v; want it moved right and down", after, before)
	}
	if err := chromedp.Do(ctx, chromedp.KeyEvent("0")); err != nil {
		t.Fatal(err)
	}
	if v := viewBox(); v != whole {
		t.Errorf("0 shows %v, want the whole graph %v", v, whole)
	}
	if err := chromedp.Do(ctx, chromedp.KeyEvent("+")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Click("#zoom-fit")); err != nil {
		t.Fatal(err)
	}
	if v := viewBox(); v != whole {
		t.Errorf("fit shows %v, want the whole graph %v", v, whole)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`document.getElementById('graph').dispatchEvent(new WheelEvent('wheel', {deltaY: -300, clientX: 600, clientY: 400, cancelable: true}))`)); err != nil {
		t.Fatal(err)
	}
	if v := viewBox(); v[2] >= whole[2] {
		t.Errorf("the wheel: the view is %v wide, the whole graph %v", v[2], whole[2])
	}
}
