package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
)

// TestPageInChromium loads the live page in headless Chromium while a pipeline runs, with dead
// letters behind it and messages held in front of a stage, and reads what the page drew.
func TestPageInChromium(t *testing.T) {
	chromium := findChromium(t)
	ctx := context.Background()
	c := server.open(t)
	// Orders come from the test and from a stream that another application would write (it stays
	// empty here).
	feed := "page-feed:" + itoa(prefixes.Add(1))
	plan := buildSource(t, `
pipeline "page" {
  description = "Orders, held at a gate and priced."
}
variable "feed" {}
source "feed" {
  kind   = "redis_stream"
  stream = var.feed
  output = topic.orders
}
topic "orders" {
  partitions = 2
  key        = msg.k
}
stage "gate" {
  kind     = "go"
  func     = "test.gate"
  input    = topic.orders
  ordering = "partition"
  timeout  = "10m"
}
stage "price" {
  kind  = "map"
  input = stage.gate
  set   = { cents = tonumber(msg.amount) * 100 }
}
sink "out" {
  kind  = "stdout"
  input = stage.price
}
`, "feed="+feed)
	s := startService(t, c, plan, runtime.Options{BatchSize: 1})
	publish := func(payloads ...string) {
		t.Helper()
		pub, err := runtime.NewPublisher(c, plan)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range payloads {
			if err := pub.Publish(ctx, "orders", stages.NewMessage("", []byte(p), nil)); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Ten messages pass (three of them dead-lettered by price), then five of a run whose first one
	// test.gate holds: the four others wait behind it, unread.
	var free []string
	for i := 1; i <= 10; i++ {
		amount := fmt.Sprint(i)
		if i%3 == 0 {
			amount = "n/a"
		}
		free = append(free, fmt.Sprintf(`{"k":"a","i":%d,"amount":%q}`, i, amount))
	}
	publish(free...)
	waitFor(t, "ten messages through, three dead-lettered", func() bool {
		snap := s.rt.Snapshot()
		return snap.DeadLetters["price"] == 3 && nodeIn(snap, "out") == 7
	})
	run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
	g := &gate{entered: make(chan struct{}), open: make(chan struct{})}
	gates.Store(run, g)
	var opened sync.Once
	t.Cleanup(func() { opened.Do(func() { close(g.open) }) })
	var held []string
	for i := 0; i < 5; i++ {
		held = append(held, fmt.Sprintf(`{"k":"a","i":%d,"amount":"1","run":%q}`, i, run))
	}
	publish(held...)
	waitFor(t, "the gate to hold the run's first message", func() bool {
		select {
		case <-g.entered:
			return true
		default:
			return false
		}
	})
	waitFor(t, "four messages waiting in front of the gate, as of a poll", func() bool {
		snap := s.rt.Snapshot()
		var lag, pending int64
		for _, p := range snap.Partitions {
			if p.Node == "gate" {
				lag, pending = lag+p.Lag, pending+p.Pending
			}
		}
		return lag == 4 && pending == 1 && s.rt.Ready() == nil
	})

	site := httptest.NewServer(web.NewHandler(s.rt, nil))
	defer site.Close()
	dom := parseDOM(dumpDOM(t, chromium, site.URL+"/"))
	if state := dom.find("body", "").attrs["data-state"]; state != "ok" {
		t.Fatalf("the page did not draw the graph (data-state %q):\n%s", state, dom.raw)
	}
	if name := dom.find("span", "id", "pipeline").text; name != "page" {
		t.Errorf("the header names %q", name)
	}
	if badge := dom.find("span", "id", "ready").text; badge != "ready" {
		t.Errorf("the badge says %q", badge)
	}

	nodes := map[string]domNode{}
	for _, id := range []string{"source.feed", "topic.orders", "stage.gate", "stage.price", "sink.out"} {
		nodes[id] = dom.node(t, id)
	}
	for id, want := range map[string][2]string{
		"topic.orders": {"orders", "topic · 2 partitions"},
		"stage.gate":   {"gate", "go stage: test.gate · fused"},
		"stage.price":  {"price", "map stage · fused"},
		"sink.out":     {"out", "stdout sink"},
	} {
		if name, detail := nodes[id].field("name").text, nodes[id].field("detail").text; name != want[0] || detail != want[1] {
			t.Errorf("%s reads %q, %q; want %q, %q", id, name, detail, want[0], want[1])
		}
	}
	price := nodes["stage.price"]
	for field, want := range map[string]string{"in": "10", "out": "7", "filtered": "0", "dead_lettered": "3", "dead_letters": "3"} {
		if got := price.field(field).text; got != want {
			t.Errorf("price shows %s %q, want %q", field, got, want)
		}
	}
	if !price.hasClass("has-dead-letters") || !price.field("dead_letters").hasClass("hot") || !price.field("dead_lettered").hasClass("hot") {
		t.Errorf("price's dead letters are not highlighted: %+v", price)
	}
	// Its last dead letters: the start of the latest in its box (without its location in the
	// pipeline), all three (of at most five) in full in its card.
	if last := price.field("last_dead_letter").text; !strings.HasPrefix(last, `last: invalid value for "v" param`) {
		t.Errorf("price's box shows its last dead letter as %q", last)
	}
	var reasons []string
	for _, e := range dom.card(t, "stage.price").inside {
		if e.tag == "span" && e.hasClass("reason") {
			reasons = append(reasons, e.text)
		}
	}
	if len(reasons) != 3 || !strings.Contains(reasons[0], "n/a") {
		t.Errorf("price's card lists the dead letters %q, want three, of amount n/a", reasons)
	}
	out := nodes["sink.out"]
	if in, dead := out.field("in").text, out.field("dead_letters"); in != "7" || dead.text != "0" || dead.hasClass("hot") || out.hasClass("has-dead-letters") {
		t.Errorf("out shows in %q, dead letters %+v", in, dead)
	}
	if in := nodes["stage.gate"].field("in").text; in != "10" {
		t.Errorf("gate shows in %q, want 10 (ten passed; the one held counts once its batch commits)", in)
	}
	if f := nodes["source.feed"]; f.field("stream_lag").text != "0" || f.field("stream_pending").text != "0" ||
		f.field("stream_length").text != "0" {
		t.Errorf("the redis_stream source shows stream lag %q, pending %q, length %q; want 0 each (polled, not unknown)",
			f.field("stream_lag").text, f.field("stream_pending").text, f.field("stream_length").text)
	}
	cells := nodes["topic.orders"].all("data-field", "length")
	if len(cells) != 2 {
		t.Errorf("the topic shows %d partitions, want 2", len(cells))
	}
	total := 0
	for _, cell := range cells {
		var n int
		if _, err := fmt.Sscan(cell.text, &n); err != nil {
			t.Errorf("a partition shows length %q: %v", cell.text, err)
		}
		total += n
	}
	if total != 15 {
		t.Errorf("the topic's partitions show %d entries in all, want 15", total)
	}

	label := dom.edgeLabel(t, "topic.orders>stage.gate")
	if lag, pending := label.field("lag"), label.field("pending"); lag.text != "4" || pending.text != "1" {
		t.Errorf("the edge into gate shows lag %q, pending %q; want 4 and 1", lag.text, pending.text)
	}
	highlighted := false
	for _, e := range label.inside {
		highlighted = highlighted || e.hasClass("backlog") && e.hasClass("behind")
	}
	if !highlighted {
		t.Errorf("the lag into gate is not highlighted: %+v", label)
	}
	if rate := label.field("rate").text; !regexp.MustCompile(`^[0-9.,]+ msg/s$`).MatchString(rate) {
		t.Errorf("the edge into gate shows the rate %q", rate)
	}
	if label := dom.edgeLabel(t, "stage.price>sink.out"); label.field("lag").text != "0" {
		t.Errorf("the edge into out shows lag %q", label.field("lag").text)
	}
}

// TestPageShowsWhatStatefulStagesFound loads the live page in headless Chromium while a dedupe
// and an aggregate run: each shows, on a line of its own, the messages it dropped and took into its
// windows, and those it found late or repeated; a stateless stage has no such line.
func TestPageShowsWhatStatefulStagesFound(t *testing.T) {
	chromium := findChromium(t)
	ctx := context.Background()
	c := server.open(t)
	plan := buildSource(t, `
pipeline "found" {}
topic "orders" {
  partitions = 1
  key        = msg.customer
}
stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.id
  within     = "1h"
  event_time = msg.at
}
stage "per_minute" {
  kind       = "aggregate"
  group_by = msg.customer
  input      = stage.once
  event_time = msg.at
  late       = "drop"
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { orders = count() }
}
stage "shown" {
  kind  = "map"
  input = stage.per_minute
  set   = { shown = true }
}
sink "out" {
  kind  = "stdout"
  input = stage.shown
}
`)
	s := startService(t, c, plan, runtime.Options{})
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	// o1 twice (a duplicate), o2 two minutes later (closing the first minute), then o3 in the first
	// minute (late, dropped) and o1 once more (a duplicate again): the aggregate takes in the three
	// the dedupe passes on, o1 and o2 into its windows, o3 dropped.
	for _, p := range []string{
		`{"customer":"a","id":"o1","at":10000}`, `{"customer":"a","id":"o1","at":15000}`,
		`{"customer":"a","id":"o2","at":120000}`, `{"customer":"a","id":"o3","at":20000}`,
		`{"customer":"a","id":"o1","at":125000}`,
	} {
		if err := pub.Publish(ctx, "orders", stages.NewMessage("", []byte(p), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the five orders through the dedupe, the late one through the aggregate", func() bool {
		var once, perMinute runtime.NodeSummary
		for _, n := range s.rt.Snapshot().Nodes {
			switch n.Name {
			case "once":
				once = n
			case "per_minute":
				perMinute = n
			}
		}
		return once.In == 5 && once.Duplicates == 2 && perMinute.Late == 1 && s.rt.Ready() == nil
	})

	site := httptest.NewServer(web.NewHandler(s.rt, nil))
	defer site.Close()
	dom := parseDOM(dumpDOM(t, chromium, site.URL+"/"))
	if state := dom.find("body", "").attrs["data-state"]; state != "ok" {
		t.Fatalf("the page did not draw the graph (data-state %q):\n%s", state, dom.raw)
	}
	for id, want := range map[string]map[string]string{
		"stage.once":       {"late": "0", "duplicates": "2", "dropped": "2", "absorbed": "0", "filtered": "0", "dead_letters": "0"},
		"stage.per_minute": {"late": "1", "duplicates": "0", "dropped": "1", "absorbed": "2", "filtered": "0", "dead_letters": "0"},
	} {
		n := dom.node(t, id)
		for field, v := range want {
			if got := n.field(field).text; got != v {
				t.Errorf("%s shows %s %q, want %q", id, field, got, v)
			}
		}
	}
	if shown := dom.node(t, "stage.shown"); len(shown.all("data-field", "late")) != 0 || shown.field("dead_letters").text != "0" {
		t.Errorf("the map stage shows the counts of a stateful stage: %+v", shown)
	}
}

func nodeIn(s runtime.Snapshot, name string) int64 {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n.In
		}
	}
	return -1
}

// findChromium returns the Chromium on PATH. Without one the test is skipped, unless
// FLOWRUN_REQUIRE_TOOLS is set (as in CI).
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("FLOWRUN_REQUIRE_TOOLS") != "" {
		t.Fatal("Chromium is not installed: apt-get install chromium chromium-driver")
	}
	t.Skip("Chromium is not installed (apt-get install chromium chromium-driver)")
	return ""
}

// dumpDOM loads a page in headless Chromium and returns its DOM once the page has run for a few
// seconds of virtual time (Chromium's clock, which waits for the page's requests to be answered).
// The deadline only keeps a broken browser from hanging the test.
func dumpDOM(t *testing.T, chromium, url string) string {
	t.Helper()
	profile, err := os.MkdirTemp("", "flowrun-chromium")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(profile) }() // the browser's profile, in the temporary directory
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--no-default-browser-check", "--user-data-dir="+profile, "--virtual-time-budget=4000", "--dump-dom", url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", chromium, err, stderr.String())
	}
	return stdout.String()
}

// A DOM as Chromium serializes it, read just enough for the page's markup: elements in document
// order with their attributes and the text up to their first child.
type dom struct {
	raw      string
	elements []domElement
}

type domElement struct {
	tag   string
	attrs map[string]string
	text  string
}

func (e domElement) hasClass(c string) bool {
	for _, have := range strings.Fields(e.attrs["class"]) {
		if have == c {
			return true
		}
	}
	return false
}

var (
	tagPattern  = regexp.MustCompile(`<([a-zA-Z]+)((?:\s+[\w:-]+(?:="[^"]*")?)*)\s*/?>([^<]*)`)
	attrPattern = regexp.MustCompile(`([\w:-]+)(?:="([^"]*)")?`)
)

func parseDOM(s string) dom {
	d := dom{raw: s}
	for _, m := range tagPattern.FindAllStringSubmatch(s, -1) {
		e := domElement{tag: strings.ToLower(m[1]), attrs: map[string]string{}, text: html.UnescapeString(m[3])}
		for _, a := range attrPattern.FindAllStringSubmatch(m[2], -1) {
			e.attrs[a[1]] = html.UnescapeString(a[2])
		}
		d.elements = append(d.elements, e)
	}
	return d
}

// find returns the first element with the tag (and the attribute, if one is given).
func (d dom) find(tag string, attr ...string) domElement {
	for _, e := range d.elements {
		if e.tag == tag && (len(attr) < 2 || e.attrs[attr[0]] == attr[1]) {
			return e
		}
	}
	return domElement{attrs: map[string]string{}}
}

// domNode is an element and the elements it contains.
type domNode struct {
	domElement
	inside []domElement
}

func (n domNode) all(attr, value string) []domElement {
	var out []domElement
	for _, e := range n.inside {
		if e.attrs[attr] == value {
			out = append(out, e)
		}
	}
	return out
}

func (n domNode) field(name string) domElement {
	if f := n.all("data-field", name); len(f) > 0 {
		return f[0]
	}
	return domElement{attrs: map[string]string{}}
}

// node returns the drawing of a graph node: its group, and the elements up to the next group (the
// page nests no group in a node's).
func (d dom) node(t *testing.T, id string) domNode {
	t.Helper()
	for i, e := range d.elements {
		if e.tag == "g" && e.attrs["data-node"] == id {
			n := domNode{domElement: e}
			for _, in := range d.elements[i+1:] {
				if in.tag == "g" {
					break
				}
				n.inside = append(n.inside, in)
			}
			return n
		}
	}
	t.Fatalf("the page draws no node %s:\n%s", id, d.raw)
	return domNode{}
}

// card returns a node's card in the list below the graph: its element, and the elements up to the
// next card.
func (d dom) card(t *testing.T, id string) domNode {
	t.Helper()
	for i, e := range d.elements {
		if e.tag == "article" && e.attrs["data-card"] == id {
			n := domNode{domElement: e}
			for _, in := range d.elements[i+1:] {
				if in.tag == "article" {
					break
				}
				n.inside = append(n.inside, in)
			}
			return n
		}
	}
	t.Fatalf("the page has no card of %s:\n%s", id, d.raw)
	return domNode{}
}

// edgeLabel returns the numbers drawn on an edge: its text element and the spans in it.
func (d dom) edgeLabel(t *testing.T, id string) domNode {
	t.Helper()
	for i, e := range d.elements {
		if e.tag == "text" && e.attrs["data-edge"] == id {
			n := domNode{domElement: e}
			for _, in := range d.elements[i+1:] {
				if in.tag != "tspan" {
					break
				}
				n.inside = append(n.inside, in)
			}
			return n
		}
	}
	t.Fatalf("the page draws no label on edge %s:\n%s", id, d.raw)
	return domNode{}
}
