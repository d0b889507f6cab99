package cmd

import (
	"bytes"
	"context"
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
