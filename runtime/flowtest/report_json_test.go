package flowtest

import (
	"bufio"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
)

func hcl7() hcl.Range {
	return hcl.Range{Filename: "t.flowtest.hcl", Start: hcl.Pos{Line: 7, Column: 3}, End: hcl.Pos{Line: 7, Column: 9}}
}

func sampleResults() []*RunResult {
	return []*RunResult{
		{File: "tests/a.flowtest.hcl", Run: "happy path", Wall: 12300 * time.Microsecond, Virtual: 90 * time.Second, Seed: 42},
		{
			File: "tests/a.flowtest.hcl", Run: `quotes " & <tags> and` + "\nnewline", Wall: 2 * time.Millisecond, Seed: 42,
			Failures: []Failure{{
				Range:   hcl7(),
				Summary: "sink.out: 1 of 1 expected message did not arrive",
				Diff:    "(- expected but did not arrive, + arrived but not expected)\n- {\"a\":\"<&>\"}\n+ {\"a\":\"]]>\x01\"}",
				Why:     []string{"stage.x retried 2 times"},
			}},
		},
		{File: "tests/b.flowtest.hcl", Run: "crash", Wall: time.Second, Seed: 42, Err: errors.New("pipeline stopped:\nboom")},
	}
}

func TestJSONReporter(t *testing.T) {
	var sb strings.Builder
	j := NewJSONReporter(&sb)
	results := sampleResults()
	for _, r := range results {
		j.Run(r)
	}
	j.Done(results)
	if j.Err() != nil {
		t.Fatal(j.Err())
	}
	var events []map[string]any
	sc := bufio.NewScanner(strings.NewReader(sb.String()))
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		events = append(events, ev)
	}
	if len(events) != 4 {
		t.Fatalf("%d events, want 4:\n%s", len(events), sb.String())
	}
	pass, fail, crash, sum := events[0], events[1], events[2], events[3]
	if pass["event"] != "run" || pass["status"] != "pass" || pass["wall_ms"] != 12.3 || pass["virtual_ms"] != 90000.0 ||
		pass["seed"] != 42.0 || !reflect.DeepEqual(pass["failures"], []any{}) || pass["error"] != nil {
		t.Errorf("pass event %v", pass)
	}
	f := fail["failures"].([]any)[0].(map[string]any)
	if fail["status"] != "fail" || fail["run"] != results[1].Run || f["file"] != "t.flowtest.hcl" || f["line"] != 7.0 ||
		f["column"] != 3.0 || f["summary"] != results[1].Failures[0].Summary || f["diff"] != results[1].Failures[0].Diff ||
		!reflect.DeepEqual(f["why"], []any{"stage.x retried 2 times"}) {
		t.Errorf("fail event %v", fail)
	}
	if crash["status"] != "fail" || crash["error"] != "pipeline stopped:\nboom" {
		t.Errorf("error event %v", crash)
	}
	want := map[string]any{"event": "summary", "passed": 1.0, "failed": 2.0, "runs": 3.0, "files": 2.0, "wall_ms": 1014.3}
	if !reflect.DeepEqual(sum, want) {
		t.Errorf("summary %v, want %v", sum, want)
	}
	if !strings.Contains(sb.String(), `<&>`) {
		t.Errorf("HTML-escaped output:\n%s", sb.String())
	}
}

func TestJSONReporterConcurrentRuns(t *testing.T) {
	var sb strings.Builder
	j := NewJSONReporter(&sb)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, r := range sampleResults() {
				j.Run(r)
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(sb.String(), "\n"), "\n")
	if len(lines) != 60 {
		t.Fatalf("%d lines, want 60", len(lines))
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("not JSON: %q", l)
		}
	}
}
