package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestSummaryShowsReasonsAndCommand dead-letters every message of a job: its summary shows the
// first reasons per node (the secret redacted) and ends with the command that lists them, for the
// path the user gave, and so does the note that ends the run.
func TestSummaryShowsReasonsAndCommand(t *testing.T) {
	const secret = "s3cr3t-t0ken"
	const messages = 100
	src := `
pipeline "dl" {}
variable "token" {
  sensitive = true
  default   = "` + secret + `"
}
topic "in" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = ` + strconv.Itoa(messages) + `
  output   = topic.in
  template = { k = "k${index % 3}" }
}
stage "check" {
  kind  = "map"
  input = topic.in
  set   = { n = tonumber("${msg.k}${var.token}") }
}
sink "out" {
  kind  = "stdout"
  input = stage.check
}
`
	file := filepath.Join(t.TempDir(), "pipeline.hcl")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	plan, _, diags := flow.Build(file, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan.KeyPrefix = "t" + strconv.FormatInt(runs.Add(1), 10) + "-" + t.Name()
	c, err := redis.Open(context.Background(), redis.Options{URLs: []string{redistest.Shared(t).URL()}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const path = "pipes/dl dir"
	summary, err := runtime.Run(ctx, plan, runtime.Options{
		Redis: c, UntilDrained: true, PipelinePath: path, LeaseTTL: 10 * time.Second,
		Stdin: strings.NewReader(""), Stdout: io.Discard, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil || ctx.Err() != nil {
		t.Fatalf("run: %v %v", err, ctx.Err())
	}

	var b bytes.Buffer
	if err := writeSummary(&b, summary); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"dead letters by node, with the first reasons:\n  stage.check: 100\n    3",
		`to number; given string must be a decimal representation of a number` + "\n    list them: ",
		"\n    list them: flowrun dlq list 'pipes/dl dir' --stage check\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the summary lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(out, "--stage check\n") || strings.Contains(out, secret) {
		t.Errorf("the summary does not end with the command, or shows the secret:\n%s", out)
	}
	if note := deadLetterNote(summary); note != "100 messages dead-lettered; list them with flowrun dlq list 'pipes/dl dir' --stage check" {
		t.Errorf("note: %s", note)
	}
}

// TestSummaryShowsWhatStatefulStagesFound: the summary says what each stateful stage found late or
// repeated, and how many of those it dropped (a column of its own); the JSON summary has the same
// counts, and neither says anything of late or duplicates for the other nodes.
func TestSummaryShowsWhatStatefulStagesFound(t *testing.T) {
	s := &runtime.Summary{Elapsed: time.Second, Nodes: []runtime.NodeSummary{
		{Name: "once", Type: "stage", Kind: "dedupe", In: 5, Out: 3, Written: 3, Duplicates: 2, Dropped: 2},
		{Name: "per_minute", Type: "stage", Kind: "aggregate", In: 5, Absorbed: 3, DeadLettered: 1, Late: 2, Dropped: 1, Written: 2},
		{Name: "out", Type: "sink", Kind: "stdout", In: 3, Out: 3, Written: 3},
	}}
	var text bytes.Buffer
	if err := writeSummary(&text, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"stage.once found 2 duplicates (2 dropped)\n", "stage.per_minute found 2 late (1 dropped)\n"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the summary lacks %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(text.String(), "sink.out found") {
		t.Errorf("the summary says the sink found something:\n%s", text.String())
	}

	var js bytes.Buffer
	if err := writeSummaryJSON(&js, s); err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Nodes []map[string]any `json:"nodes"`
	}
	if err := json.Unmarshal(js.Bytes(), &rec); err != nil || len(rec.Nodes) != 3 {
		t.Fatalf("the JSON summary: %v\n%s", err, js.String())
	}
	for i, want := range []map[string]any{
		{"duplicates": 2.0, "dropped": 2.0, "filtered": 0.0, "out": 3.0},
		{"late": 2.0, "dropped": 1.0, "absorbed": 3.0, "dead_lettered": 1.0, "written": 2.0, "in_flight": 0.0},
	} {
		for k, v := range want {
			if rec.Nodes[i][k] != v {
				t.Errorf("node %d in the JSON summary has %s = %v, want %v: %v", i, k, rec.Nodes[i][k], v, rec.Nodes[i])
			}
		}
	}
	for _, k := range []string{"late", "duplicates"} {
		if _, ok := rec.Nodes[2][k]; ok {
			t.Errorf("the sink in the JSON summary has %s: %v", k, rec.Nodes[2])
		}
	}
}

// TestSummaryColumnsAddUp: the columns before the bar are the outcomes of what each node took in,
// in = out + filtered + dropped (+ absorbed) + dead-lettered (+ in flight), with absorbed and in
// flight shown only when some node has any; written, failed attempts and retries come after it.
func TestSummaryColumnsAddUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []runtime.NodeSummary
		cols  []string // the header's outcome columns after in
	}{
		{"plain", []runtime.NodeSummary{
			{Name: "file", Type: "source", Kind: "file", In: 12, Out: 10, DeadLettered: 2, Written: 10},
			{Name: "split", Type: "stage", Kind: "route", In: 10, Out: 6, Filtered: 4, Written: 12, FailedAttempts: 3, Retries: 3},
		}, []string{"out", "filtered", "dropped", "dead-lettered"}},
		{"windows and retries", []runtime.NodeSummary{
			{Name: "per_minute", Type: "stage", Kind: "aggregate", In: 9, Out: 1, Absorbed: 6, Dropped: 1, DeadLettered: 1, Written: 4},
			{Name: "hook", Type: "sink", Kind: "http", In: 4, Out: 3, InFlight: 1, Written: 3, FailedAttempts: 1, Retries: 1},
		}, []string{"out", "filtered", "dropped", "absorbed", "dead-lettered", "in flight"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeSummary(&b, &runtime.Summary{Elapsed: time.Second, Nodes: tc.nodes}); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(b.String(), "\n")
			header := strings.Split(lines[0], "|")
			if len(header) != 2 || strings.Join(strings.Fields(header[1]), " ") != "written failed attempts retries in/s" {
				t.Fatalf("header %q", lines[0])
			}
			cols := strings.Join(strings.Fields(header[0]), " ")
			if want := "node kind in " + strings.Join(tc.cols, " "); cols != want {
				t.Fatalf("outcome columns %q, want %q", cols, want)
			}
			for i := range tc.nodes {
				row := strings.Split(lines[1+i], "|")
				fields := strings.Fields(row[0])
				var in, sum int64
				for j, f := range fields[2:] {
					v, err := strconv.ParseInt(f, 10, 64)
					if err != nil {
						t.Fatalf("row %q: %v", lines[1+i], err)
					}
					if j == 0 {
						in = v
					} else {
						sum += v
					}
				}
				if in != sum || in != tc.nodes[i].In {
					t.Errorf("row %q: in %d, the outcomes sum to %d", lines[1+i], in, sum)
				}
			}
		})
	}
}
