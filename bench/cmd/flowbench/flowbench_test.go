package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

func TestPayload(t *testing.T) {
	buf := make([]byte, payloadSize)
	ts := time.Date(2026, 11, 30, 6, 0, 0, 123, time.UTC).UnixNano()
	putPayload(buf, ts, phaseFlat, 987654321)
	if len(payloadTemplate) != payloadSize {
		t.Fatalf("template is %d bytes, want %d", len(payloadTemplate), payloadSize)
	}
	var v struct {
		TS  int64  `json:"ts"`
		Seq string `json:"seq"`
		Pad string `json:"pad"`
	}
	if err := json.Unmarshal(buf, &v); err != nil {
		t.Fatalf("payload %s is not JSON: %v", buf, err)
	}
	if v.TS != ts || v.Seq != "f987654321" {
		t.Errorf("decoded %+v, want ts %d seq f987654321", v, ts)
	}
	gotTS, phase, ok := readPayload(string(buf))
	if !ok || gotTS != ts || phase != phaseFlat {
		t.Errorf("readPayload = %d %c %v, want %d f true", gotTS, phase, ok, ts)
	}
	if _, _, ok := readPayload(`{"other":1}`); ok {
		t.Error("readPayload accepted a foreign payload")
	}
}

func TestPipelinesCompile(t *testing.T) {
	files, err := writePipelines(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, path := range files {
		plan, _, diags := flow.Build(path, flow.Options{GoFuncs: stages.Names()})
		if diags.HasErrors() {
			src, _ := os.ReadFile(path)
			t.Fatalf("%s does not compile: %s\n%s", name, diags.Error(), src)
		}
		want := 1
		if name != "fw1" {
			want = 3
		}
		if len(plan.Stages) != want {
			t.Errorf("%s has %d stages, want %d", filepath.Base(path), len(plan.Stages), want)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
	stat := "4242 (flow run) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 1000 0 0"
	got, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 325 * clockTick; got != want {
		t.Errorf("parseStatCPU = %s, want %s", got, want)
	}
}

func TestStatistics(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median = %v, want 2", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median = %v, want 2.5", m)
	}
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(100-i) * time.Millisecond
	}
	if p := percentile(ds, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %s, want 50ms", p)
	}
	if p := percentile(ds, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %s, want 99ms", p)
	}
}
