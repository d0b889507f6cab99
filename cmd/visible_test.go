package cmd

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime/admin"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// deadLetterPipeline dead-letters the messages whose amount is not a number: 2 of 6.
const deadLetterPipeline = `
topic "orders" { partitions = 2 }
source "gen" {
  kind     = "generate"
  count    = 6
  output   = topic.orders
  template = { id = "o${index}", amount = index % 3 == 1 ? "n/a" : tostring(index) }
}
stage "price" {
  kind  = "map"
  input = topic.orders
  set   = { cents = tonumber(msg.amount) * 100 }
}
sink "out" {
  kind  = "stdout"
  input = stage.price
}
`

// TestRunSummaryNamesTheDeadLetters: with a configured Redis, the summary ends with each node's
// reasons and the command that lists its dead letters, for the path the user gave.
func TestRunSummaryNamesTheDeadLetters(t *testing.T) {
	path, _ := testPipeline(t, deadLetterPipeline)
	code, out, errOut := runIn(t, "", "run", path, "--until-drained", "--redis", redistest.Shared(t).URL())
	if code != ExitDeadLettered || strings.Count(out, "\n") != 4 {
		t.Fatalf("exit %d, %d lines out\n%s", code, strings.Count(out, "\n"), errOut)
	}
	list := "flowrun dlq list " + path + " --stage price"
	for _, want := range []string{
		"\n  stage.price: 2\n    2x ",
		`cannot convert "n/a" to number`,
		"\n    list them: " + list + "\n",
		"Error: 2 messages dead-lettered; list them with " + list + "\n",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "see flowrun inspect") {
		t.Errorf("the old advice is still there:\n%s", errOut)
	}
	if code, out, errOut := runIn(t, "", "dlq", "list", path, "--stage", "price", "--redis", redistest.Shared(t).URL()); code != ExitOK ||
		!strings.Contains(out, "\n2 dead letters\n") {
		t.Errorf("the suggested command: exit %d\n%s%s", code, out, errOut)
	}
}

// TestRunOnTheEmbeddedRedisPrintsTheDeadLetters: the embedded Redis loses its dead letters at exit,
// so the summary prints every one of them, and says so.
func TestRunOnTheEmbeddedRedisPrintsTheDeadLetters(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	path, _ := testPipeline(t, deadLetterPipeline)
	code, _, errOut := runIn(t, "", "run", path, "--until-drained")
	if code != ExitDeadLettered {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	line := regexp.MustCompile(`(?m)^  stage\.price partition=[01] id="\d+-\d+" key="" attempts=1 error=".*cannot convert \\"n/a\\" to number.*" payload=\{"amount":"n/a","id":"o[14]"\}$`)
	if got := line.FindAllString(errOut, -1); len(got) != 2 || got[0] == got[1] {
		t.Errorf("%d dead letters printed, want o1 and o4:\n%s", len(got), errOut)
	}
	for _, want := range []string{
		"the embedded Redis loses its dead letters when flowrun exits; here are all 2:\n",
		"Error: 2 messages dead-lettered; the embedded Redis loses them at exit, so they are printed above\n",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "flowrun dlq list") {
		t.Errorf("the summary suggests a command that cannot find them:\n%s", errOut)
	}
}

// TestRunLogFormatJSON: with --log-format json, every line flowrun run writes on standard error is
// a JSON record: the embedded Redis's warning, the log, the dead letters, the summary and the error.
func TestRunLogFormatJSON(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	path, _ := testPipeline(t, deadLetterPipeline)
	code, _, errOut := runIn(t, "", "run", path, "--until-drained", "--log-format", "json")
	if code != ExitDeadLettered {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	type record struct {
		Level    string `json:"level"`
		Msg      string `json:"msg"`
		ExitCode int    `json:"exit_code"`
		Node     string `json:"node"`
		Nodes    []struct {
			Node         string `json:"node"`
			In           int64  `json:"in"`
			Out          int64  `json:"out"`
			DeadLettered int64  `json:"dead_lettered"`
			Reasons      []struct {
				Reason string `json:"reason"`
				Count  int64  `json:"count"`
			} `json:"reasons"`
		} `json:"nodes"`
	}
	var recs []record
	for _, l := range strings.Split(strings.TrimSuffix(errOut, "\n"), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("not JSON: %q (%v)\n%s", l, err, errOut)
		}
		var r record
		if rec["msg"] == "job summary" || rec["level"] == "ERROR" || strings.HasPrefix(rec["msg"].(string), "dead letter") {
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
		} else {
			r.Level, r.Msg = rec["level"].(string), rec["msg"].(string)
			r.Node, _ = rec["node"].(string)
		}
		recs = append(recs, r)
	}
	if len(recs) < 4 || recs[0].Level != "WARN" || !strings.Contains(recs[0].Msg, "embedded in-memory Redis") {
		t.Errorf("the first record is not the embedded Redis's warning: %+v", recs[0])
	}
	last, summary := recs[len(recs)-1], recs[len(recs)-2]
	if last.Level != "ERROR" || last.ExitCode != ExitDeadLettered || !strings.HasPrefix(last.Msg, "2 messages dead-lettered") {
		t.Errorf("the last record is not the error: %+v", last)
	}
	if summary.Msg != "job summary" || len(summary.Nodes) != 3 {
		t.Fatalf("the summary record: %+v", summary)
	}
	if p := summary.Nodes[1]; p.Node != "price" || p.In != 6 || p.Out != 4 || p.DeadLettered != 2 ||
		len(p.Reasons) != 1 || p.Reasons[0].Count != 2 || !strings.Contains(p.Reasons[0].Reason, `"n/a"`) {
		t.Errorf("price in the summary: %+v", p)
	}
	if o := summary.Nodes[2]; o.Node != "out" || o.Out != 4 {
		t.Errorf("out in the summary: %+v (a sink's out is what it delivered)", o)
	}
	printed, logged := 0, 0
	for _, r := range recs {
		switch {
		case strings.HasPrefix(r.Msg, "dead letter, lost when the embedded Redis exits") && r.Node == "stage.price":
			printed++
		case r.Msg == "message dead-lettered" && r.Node == "price" && r.Level == "WARN":
			logged++
		}
	}
	if printed != 2 || logged != 2 {
		t.Errorf("%d dead letters printed and %d logged, want 2 each:\n%s", printed, logged, errOut)
	}

	// A command line that asks for JSON gets its usage errors as JSON too.
	code, _, errOut = runIn(t, "", "run", path, "--log-format", "json", "--bogus")
	var r record
	if err := json.Unmarshal([]byte(strings.TrimSpace(errOut)), &r); err != nil || code != ExitInvalid || r.Level != "ERROR" ||
		!strings.Contains(r.Msg, "bogus") {
		t.Errorf("a bad flag with --log-format json: exit %d, %q", code, errOut)
	}
}

// TestInspectShowsASourceStreamsLag: what a redis_stream source has not read yet of its stream is its
// lag in inspect, in the table and the JSON.
func TestInspectShowsASourceStreamsLag(t *testing.T) {
	ctx := testContext(t)
	url := redistest.Shared(t).URL()
	path, prefix := testPipeline(t, `
variable "stream" {}
topic "in" {}
source "ext" {
  kind   = "redis_stream"
  stream = var.stream
  output = topic.in
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`)
	stream := prefix + ":external"
	c, err := redis.Open(ctx, redis.Options{URLs: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	xadd := func(n int) {
		for i := 0; i < n; i++ {
			if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"i", i}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	xadd(2)
	if code, _, errOut := runIn(t, "", "run", path, "--until-drained", "--redis", url, "--var", "stream="+stream); code != ExitOK {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	xadd(3) // after the job: not read yet

	code, out, errOut := runIn(t, "", "inspect", path, "--json", "--redis", url, "--var", "stream="+stream)
	if code != ExitOK {
		t.Fatalf("inspect: exit %d\n%s", code, errOut)
	}
	r := parseInspect(t, out)
	var in *admin.SourceInputReport
	for _, s := range r.Sources {
		if s.Name == "ext" {
			in = s.Input
		}
	}
	if in == nil || in.Stream != stream || !in.Exists || in.Length != 5 || !in.Group.Exists || in.Group.Lag != 3 ||
		in.Group.Pending != 0 || in.Group.Group != "flowrun."+r.Pipeline+".ext" || in.Group.Reader != "source.ext" {
		t.Fatalf("the source's input: %+v", in)
	}
	code, out, errOut = runIn(t, "", "inspect", path, "--redis", url, "--var", "stream="+stream)
	if code != ExitOK {
		t.Fatalf("inspect: exit %d\n%s", code, errOut)
	}
	row := regexp.MustCompile(`(?m)^source\.ext\s+` + regexp.QuoteMeta(stream) + `\s+5\s+flowrun\.\S+\.ext\s+3\s+0\s+\d+\s+-$`)
	header := regexp.MustCompile(`(?m)^SOURCE\s+STREAM\s+LENGTH\s+GROUP\s+LAG\s+PENDING\s`)
	if !header.MatchString(out) || !row.MatchString(out) {
		t.Errorf("the table does not show the source's lag of 3:\n%s", out)
	}
}
