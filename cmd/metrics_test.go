package cmd

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
)

// TestMetricsScrape runs a pipeline as a service with --http and scrapes /metrics while it runs.
func TestMetricsScrape(t *testing.T) {
	path, _ := testPipeline(t, `
topic "in" {
  partitions = 2
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = 50
  output   = topic.in
  template = {
    k  = "k${index % 5}"
    at = 1767225600000 + index * 1000
  }
}
stage "once" {
  kind       = "dedupe"
  input      = topic.in
  key        = msg.k
  within     = "1h"
  event_time = msg.at
}
sink "kept" {
  kind  = "stdout"
  input = stage.once
}
stage "pass" {
  kind  = "filter"
  input = topic.in
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.pass
}
`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errOut := newLineWriter()
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"run", path, "--redis", redistest.Shared(t).URL(), "--http", "127.0.0.1:0"},
			IO{In: strings.NewReader(""), Out: io.Discard, Err: errOut})
	}()
	urlRE := regexp.MustCompile(`url=(http://\S+/)`)
	var base string
	for base == "" {
		if m := urlRE.FindStringSubmatch(errOut.next(t)); m != nil {
			base = m[1]
		}
	}
	// Wait for what the test asserts: the counters, the histograms and the gauges of the timed poll
	// of the streams, which come a poll interval (2s) after the work, which takes less.
	wants := []*regexp.Regexp{
		regexp.MustCompile(`flowrun_messages_in_total\{flowrun_node="out"[^}]*\} 50\n`),
		regexp.MustCompile(`flowrun_messages_in_total\{flowrun_node="gen"`),
		regexp.MustCompile(`flowrun_message_duration_seconds_bucket`),
		regexp.MustCompile(`flowrun_message_age_seconds_count`),
		// The per-message histograms (runtime.Histograms, read by the exporter) count every message.
		regexp.MustCompile(`flowrun_message_duration_seconds_count\{flowrun_node="out"[^}]*\} 50\n`),
		regexp.MustCompile(`flowrun_message_age_seconds_count\{flowrun_node="out"[^}]*\} 50\n`),
		regexp.MustCompile(`flowrun_message_duration_seconds_bucket\{flowrun_node="out"[^}]*le="\+Inf"\} 50\n`),
		// A poll after the stage read everything: its lag is 0 on both partitions.
		regexp.MustCompile(`flowrun_partition_lag\{flowrun_node="pass",[^}]*partition_id="0"\} 0\n`),
		regexp.MustCompile(`flowrun_partition_lag\{flowrun_node="pass",[^}]*partition_id="1"\} 0\n`),
		regexp.MustCompile(`flowrun_leases_held`),
		// The dedupe's watermark in each partition, behind the clock.
		regexp.MustCompile(`flowrun_watermark_lag_seconds\{flowrun_node="once",messaging_destination_name="in",messaging_destination_partition_id="0"\} -?[0-9.e+]+\n`),
		regexp.MustCompile(`flowrun_watermark_lag_seconds\{flowrun_node="once",messaging_destination_name="in",messaging_destination_partition_id="1"\} -?[0-9.e+]+\n`),
	}
	var body string
	var missing []string
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(base + "metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		missing = missing[:0]
		for _, w := range wants {
			if !w.MatchString(body) {
				missing = append(missing, w.String())
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %v:\n%s", missing, body)
		}
	}
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	t.Logf("a scrape of /metrics:\n%s", grepLines(body, "flowrun_messages_in_total", "flowrun_partition_lag{", "flowrun_leases_held",
		"flowrun_watermark_lag_seconds{"))
}

// grepLines keeps the lines of s that contain one of the words.
func grepLines(s string, words ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
