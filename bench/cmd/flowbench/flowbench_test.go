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
		TS     int64  `json:"ts"`
		Seq    string `json:"seq"`
		Key    string `json:"key"`
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
		At     int64  `json:"at"`
		Pad    string `json:"pad"`
	}
	if err := json.Unmarshal(buf, &v); err != nil {
		t.Fatalf("payload %s is not JSON: %v", buf, err)
	}
	if v.TS != ts || v.Seq != "f987654321" || v.At != ts/1e6 || v.ID != "f987654321" || v.Amount < 1000 || v.Amount > 9999 ||
		len(v.Key) != 1+keyDigits {
		t.Errorf("decoded %+v, want ts %d seq f987654321 id f987654321 at %d, an amount of four digits and a key", v, ts, ts/1e6)
	}
	gotTS, phase, ok := readPayload(string(buf))
	if !ok || gotTS != ts || phase != phaseFlat {
		t.Errorf("readPayload = %d %c %v, want %d f true", gotTS, phase, ok, ts)
	}
	if _, _, ok := readPayload(`{"other":1}`); ok {
		t.Error("readPayload accepted a foreign payload")
	}
}

// TestStatefulShares checks what the stateful scenarios rely on: one message in dupEvery repeats
// an id, and the groups are many and used about evenly.
func TestStatefulShares(t *testing.T) {
	const n = 200_000
	ids, groups := map[int]bool{}, map[uint64]int{}
	for seq := range n {
		ids[idOf(seq)] = true
		groups[groupOf(seq)]++
	}
	if len(ids) != distinct(n) || distinct(n) != n*9/10 {
		t.Errorf("%d distinct ids in %d messages, distinct says %d; want %d", len(ids), n, distinct(n), n*9/10)
	}
	if len(groups) != aggKeys {
		t.Errorf("%d groups, want %d", len(groups), aggKeys)
	}
	for g, c := range groups {
		if c < n/aggKeys/2 || c > n/aggKeys*2 {
			t.Errorf("group %d has %d messages, want about %d", g, c, n/aggKeys)
		}
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
		want := 0
		for _, p := range benchPipelines {
			if p.name == name {
				want = p.k
			}
		}
		got := 0
		for _, s := range plan.Stages {
			if s.Kind != flow.TableKind { // a table's own stage
				got++
			}
		}
		if got != want {
			t.Errorf("%s has %d stages, want %d", filepath.Base(path), got, want)
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
