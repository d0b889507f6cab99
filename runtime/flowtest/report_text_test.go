package flowtest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

const testSource = `run "happy path" {
  send "topic.orders" {
    messages = [{ id = 1 }]
  }

  expect "sink.out" {
    messages = [{ id = 1, amount = 5 }]
  }
}
`

func parsedFiles(t *testing.T) map[string]*hcl.File {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(testSource), "tests/orders.flowtest.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return map[string]*hcl.File{"tests/orders.flowtest.hcl": f}
}

var expectBlock = hcl.Range{
	Filename: "tests/orders.flowtest.hcl",
	Start:    hcl.Pos{Line: 6, Column: 3, Byte: strings.Index(testSource, "expect")},
	End:      hcl.Pos{Line: 6, Column: 20, Byte: strings.Index(testSource, "expect") + 17},
}

func TestWriteTextPass(t *testing.T) {
	var sb strings.Builder
	r := &RunResult{File: "tests/orders.flowtest.hcl", Run: "happy path", Wall: 12300 * time.Microsecond, Virtual: 90 * time.Second}
	if err := WriteText(&sb, r, parsedFiles(t), false); err != nil {
		t.Fatal(err)
	}
	want := "PASS  tests/orders.flowtest.hcl: run \"happy path\" (12ms, 1m30s virtual)\n"
	if sb.String() != want {
		t.Errorf("got\n%q\nwant\n%q", sb.String(), want)
	}
}

func TestWriteTextFail(t *testing.T) {
	long := `- {"description":"` + strings.Repeat("x", 120) + `"}`
	r := &RunResult{
		File: "tests/orders.flowtest.hcl", Run: "happy path", Wall: 3 * time.Millisecond,
		Failures: []Failure{{
			Range:   expectBlock,
			Summary: "sink.out: 1 of 1 expected message did not arrive",
			Diff:    "(- expected but did not arrive, + arrived but not expected)\n" + long + "\n+ {\"id\":1}",
			Why:     []string{"stage.only_big filtered 1 of 1 message (the where at pipeline.hcl:12)"},
		}},
		Err: errors.New("pipeline stopped: boom"),
		Seen: map[string][]Arrived{
			"topic.scored": {{Key: "c1", Payload: []byte("{\n \"id\": 1\n}")}},
			"sink.out":     {{Payload: []byte(`{"id":1}`)}},
			"sink.empty":   nil,
		},
	}
	var sb strings.Builder
	if err := WriteText(&sb, r, parsedFiles(t), true); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	checkLines(t, out, []string{
		`FAIL  tests/orders.flowtest.hcl: run "happy path" (3ms, 0s virtual)`,
		"    Error: sink.out: 1 of 1 expected message did not arrive",
		"      on tests/orders.flowtest.hcl line 6, in run \"happy path\":",
		`       6:   expect "sink.out" {`,
		"    (- expected but did not arrive, + arrived but not expected)",
		"    " + long, // not wrapped
		`    + {"id":1}`,
		"    What happened:",
		"      stage.only_big filtered 1 of 1 message (the where at pipeline.hcl:12)",
		"    Error: the run did not complete: pipeline stopped: boom",
		"    sink.empty: nothing arrived",
		"    sink.out (1):",
		`      {"id":1}`,
		"    topic.scored (1):",
		`      key=c1 {"id":1}`,
	})
	if strings.Contains(out, "    \n") || strings.Contains(out, " \n") {
		t.Errorf("trailing spaces in\n%s", out)
	}
}

func TestWriteTextFailureWithoutSource(t *testing.T) {
	r := &RunResult{File: "t.flowtest.hcl", Run: "r", Failures: []Failure{{Summary: "assert failed"}}}
	var sb strings.Builder
	if err := WriteText(&sb, r, nil, false); err != nil {
		t.Fatal(err)
	}
	checkLines(t, sb.String(), []string{`FAIL  t.flowtest.hcl: run "r" (0s, 0s virtual)`, "    Error: assert failed"})
}

func TestWriteTextSummary(t *testing.T) {
	pass := func(file string, wall time.Duration) *RunResult { return &RunResult{File: file, Wall: wall} }
	var sb strings.Builder
	if err := WriteTextSummary(&sb, []*RunResult{
		pass("a", 100*time.Millisecond), pass("a", 100*time.Millisecond), pass("b", 150*time.Millisecond),
		{File: "b", Wall: 50 * time.Millisecond, Err: errors.New("x")},
	}, 42); err != nil {
		t.Fatal(err)
	}
	want := "3 passed, 1 failed (2 files, 0.4s)\nseed 42: replay with -seed 42\n"
	if sb.String() != want {
		t.Errorf("got %q, want %q", sb.String(), want)
	}
	sb.Reset()
	if err := WriteTextSummary(&sb, []*RunResult{pass("a", 2*time.Millisecond)}, 7); err != nil {
		t.Fatal(err)
	}
	if want := "1 passed, 0 failed (1 file, 2ms)\n"; sb.String() != want {
		t.Errorf("got %q, want %q", sb.String(), want)
	}
}
