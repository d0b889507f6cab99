package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testWith runs flowrun test with args.
func testWith(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Execute(context.Background(), append([]string{"test"}, args...), IO{In: strings.NewReader(""), Out: &out, Err: &errOut})
	return code, out.String(), errOut.String()
}

// A pipeline that doubles amounts, and a test file with one run that passes and one that expects
// a wrong value.
const doublePipeline = `
pipeline "double" {
  key_prefix = "double"
}

topic "in" {
  partitions = 2
}

stage "double" {
  kind  = "map"
  input = topic.in
  set = {
    amount = msg.amount * 2
  }
}

sink "out" {
  kind  = "stdout"
  input = stage.double
}
`

const doubleTests = `
run "doubles" {
  send {
    topic    = topic.in
    messages = [{ id = 1, amount = 5 }]
  }
  expect {
    sink     = sink.out
    messages = [{ id = 1, amount = 10 }]
  }
}

run "expects a wrong value" {
  send {
    topic    = topic.in
    messages = [{ id = 2, amount = 7 }]
  }
  expect {
    sink     = sink.out
    messages = [{ id = 2, amount = 15 }]
  }
}
`

func writeTestPipeline(t *testing.T, tests string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range map[string]string{"double.hcl": doublePipeline, "double.flowtest.hcl": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A failing expectation exits 1 with its file:line, a diff and the seed to replay it with.
func TestTestReportsAFailureWithItsLocationAndADiff(t *testing.T) {
	dir := writeTestPipeline(t, doubleTests)
	code, out, errOut := testWith(t, dir, "-seed", "7")
	if code != ExitError {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`PASS  ` + filepath.Join(dir, "double.flowtest.hcl") + `: run "doubles"`,
		`FAIL  ` + filepath.Join(dir, "double.flowtest.hcl") + `: run "expects a wrong value"`,
		"line 18", // the expect block
		`- {"amount":15,"id":2}`,
		`+ {"amount":14,"id":2}`,
		"1 passed, 1 failed",
		"replay with -seed 7",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}

// -run selects runs by FILE/RUN; -json writes one event a line; -junit-xml a report with a
// testcase per run.
func TestTestFlags(t *testing.T) {
	dir := writeTestPipeline(t, doubleTests)
	if code, out, errOut := testWith(t, dir, "-run", "doubles$"); code != ExitOK || !strings.Contains(out, "1 passed, 0 failed") {
		t.Fatalf("-run doubles$: exit %d\n%s%s", code, out, errOut)
	}

	junit := filepath.Join(t.TempDir(), "report.xml")
	code, out, errOut := testWith(t, dir, "-json", "-junit-xml", junit)
	if code != ExitError {
		t.Fatalf("-json: exit %d\n%s%s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("-json: %d lines, want a run event per run and a summary:\n%s", len(lines), out)
	}
	for _, l := range lines {
		var event map[string]any
		if err := json.Unmarshal([]byte(l), &event); err != nil {
			t.Fatalf("-json: not JSON: %s", l)
		}
	}

	raw, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Suites []struct {
			Cases []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(raw, &report); err != nil {
		t.Fatalf("the JUnit report is not XML: %v\n%s", err, raw)
	}
	if len(report.Suites) != 1 || len(report.Suites[0].Cases) != 2 {
		t.Fatalf("want one suite of two testcases:\n%s", raw)
	}
	if c := report.Suites[0].Cases; c[0].Failure != nil || c[1].Failure == nil || c[1].Name != "expects a wrong value" {
		t.Errorf("testcases: %+v", c)
	}
}

// An invalid test file exits 2 with a located diagnostic, and runs nothing.
func TestTestRefusesAnInvalidTestFile(t *testing.T) {
	dir := writeTestPipeline(t, `
run "typo" {
  send {
    topic    = topic.inn
    messages = [{ id = 1 }]
  }
  expect {
    sink  = sink.out
    count = 1
  }
}
`)
	code, out, errOut := testWith(t, dir)
	if code != ExitInvalid || !strings.Contains(errOut, `"in"`) || !strings.Contains(errOut, "double.flowtest.hcl line 4") {
		t.Fatalf("exit %d, want 2 with a located error that suggests topic.in\n%s%s", code, out, errOut)
	}
	if strings.Contains(out, "PASS") || strings.Contains(out, "FAIL") {
		t.Errorf("a run ran although the file is invalid:\n%s", out)
	}
}

// -update writes a golden file with what arrived; the next run compares with it.
func TestTestUpdatesGoldenFiles(t *testing.T) {
	dir := writeTestPipeline(t, `
run "golden" {
  send {
    topic    = topic.in
    messages = [{ id = 1, amount = 1 }, { id = 2, amount = 2 }]
  }
  expect {
    sink  = sink.out
    file  = "golden/out.jsonl"
    match = "unordered"
  }
}
`)
	if code, out, errOut := testWith(t, dir, "-update"); code != ExitOK {
		t.Fatalf("-update: exit %d\n%s%s", code, out, errOut)
	}
	golden, err := os.ReadFile(filepath.Join(dir, "golden", "out.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"amount":2,"id":1}`, `{"amount":4,"id":2}`} {
		if !strings.Contains(string(golden), want) {
			t.Errorf("the golden file lacks %s:\n%s", want, golden)
		}
	}
	if code, out, errOut := testWith(t, dir); code != ExitOK {
		t.Fatalf("after -update: exit %d\n%s%s", code, out, errOut)
	}
	if err := os.WriteFile(filepath.Join(dir, "golden", "out.jsonl"), []byte(`{"id":1,"amount":3}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := testWith(t, dir); code != ExitError || !strings.Contains(out, "golden/out.jsonl:1") {
		t.Fatalf("a wrong golden file: exit %d, want 1 naming golden/out.jsonl:1\n%s", code, out)
	}
}
