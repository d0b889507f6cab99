package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/schema"
	"github.com/flowrun/flowrun/stages"
)

// run executes the command line and returns its exit code and output.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Execute(context.Background(), args, IO{In: strings.NewReader(""), Out: &out, Err: &errOut})
	return code, out.String(), errOut.String()
}

const examples = "../examples/pipelines"

func TestValidateExamples(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join(examples, "*"))
	code, out, errOut := run(t, append([]string{"validate"}, paths...)...)
	if code != ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if got := strings.Count(out, "is valid"); got != len(paths) {
		t.Fatalf("%d pipelines reported valid of %d:\n%s", got, len(paths), out)
	}
}

const broken = `pipeline "b" {}
topic "orders" {
  partitions = 0
}
`

func writePipeline(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestValidateBrokenFile(t *testing.T) {
	path := writePipeline(t, broken)
	code, _, errOut := run(t, "validate", path)
	if code != ExitInvalid {
		t.Fatalf("exit %d, want %d", code, ExitInvalid)
	}
	for _, want := range []string{
		"Error: Invalid value for partitions",
		"on " + path + " line 3, in topic \"orders\":",
		"3:   partitions = 0",
		"partitions must be at least 1",
		"1 error",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

func TestValidateJSON(t *testing.T) {
	path := writePipeline(t, broken)
	code, out, _ := run(t, "validate", "--json", path)
	if code != ExitInvalid {
		t.Fatalf("exit %d", code)
	}
	var report validateReport
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if report.Valid || report.ErrorCount != 1 || report.WarningCount != 1 || len(report.Diagnostics) != 2 ||
		report.Pipelines[0].Name != "b" {
		t.Fatalf("report = %+v", report)
	}
	d := report.Diagnostics[1] // after the warning about the unused topic, declared on line 2
	if d.Severity != "error" {
		t.Fatalf("diagnostics out of order: %+v", report.Diagnostics)
	}
	if d.Range == nil || d.Range.Start.Line != 3 || d.Range.Start.Column != 16 || d.Snippet == nil ||
		!strings.Contains(d.Snippet.Code, "partitions = 0") {
		t.Fatalf("diagnostic = %+v", d)
	}
}

// validate --json estimates a dedupe stage's state: per remembered key and, with max_keys, the most
// per partition and in all.
func TestValidateJSONEstimatesDedupeState(t *testing.T) {
	path := writePipeline(t, `pipeline "d" {}
topic "orders" {
  partitions = 3
  key        = msg.id
}
source "s" {
  kind   = "stdin"
  output = topic.orders
}
stage "bounded" {
  kind     = "dedupe"
  input    = topic.orders
  key      = msg.id
  within   = "1h"
  max_keys = 1000
}
stage "unbounded" {
  kind   = "dedupe"
  input  = topic.orders
  key    = msg.id
  within = "1h"
}
sink "a" {
  kind  = "stdout"
  input = stage.bounded
}
sink "b" {
  kind  = "stdout"
  input = stage.unbounded
}
`)
	code, out, _ := run(t, "validate", "--json", path)
	if code != ExitOK {
		t.Fatalf("exit %d\n%s", code, out)
	}
	var report validateReport
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	perKey := stages.DedupeBytesPerKey(stages.DedupeAssumedKeyLength)
	inProcess := stages.DedupeProcessBytesPerKey(stages.DedupeAssumedKeyLength)
	want := []stateEstimate{
		{Stage: "bounded", Kind: "dedupe", Partitions: 3, BytesPerKey: perKey, KeyBytes: stages.DedupeAssumedKeyLength,
			Formula: stages.DedupeBytesPerKeyFormula, MaxKeys: 1000, MaxBytesPerPartition: 1000 * perKey, MaxBytes: 3000 * perKey,
			ProcessBytesPerKey: inProcess, ProcessFormula: stages.DedupeProcessBytesPerKeyFormula, MaxProcessBytesPerPartition: 1000 * inProcess},
		{Stage: "unbounded", Kind: "dedupe", Partitions: 3, BytesPerKey: perKey, KeyBytes: stages.DedupeAssumedKeyLength,
			Formula: stages.DedupeBytesPerKeyFormula, ProcessBytesPerKey: inProcess, ProcessFormula: stages.DedupeProcessBytesPerKeyFormula},
	}
	if got := report.Pipelines[0].State; !reflect.DeepEqual(got, want) {
		t.Fatalf("state estimates:\n%+v\nwant\n%+v", got, want)
	}
	if perKey != 192 || !strings.Contains(out, `"max_bytes": 576000`) || inProcess != 116 {
		t.Fatalf("a 36-byte key takes 120 + 2 * 36 bytes in Redis, 1000 of them in 3 partitions 576000, and 80 + 36 in the process:\n%s", out)
	}
}

func TestValidateVarFlags(t *testing.T) {
	path := writePipeline(t, `pipeline "v" {}
variable "parts" { type = number }
topic "t" { partitions = var.parts }
source "s" {
  kind   = "stdin"
  output = topic.t
}
sink "o" {
  kind  = "stdout"
  input = topic.t
}
`)
	if code, _, errOut := run(t, "validate", path); code != ExitInvalid || !strings.Contains(errOut, "No value for required variable") {
		t.Fatalf("without --var: exit %d\n%s", code, errOut)
	}
	if code, out, errOut := run(t, "validate", "--var", "parts=3", path); code != ExitOK {
		t.Fatalf("with --var: exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("FLOWRUN_VAR_parts", "2")
	if code, _, errOut := run(t, "validate", path); code != ExitOK {
		t.Fatalf("with FLOWRUN_VAR_parts: exit %d\n%s", code, errOut)
	}
}

func TestFmt(t *testing.T) {
	path := writePipeline(t, "pipeline \"f\" {\nkey_prefix=\"f\"\n}\n")
	code, out, _ := run(t, "fmt", "--check", path)
	if code != ExitError || strings.TrimSpace(out) != path {
		t.Fatalf("--check on an unformatted file: exit %d, out %q", code, out)
	}
	code, out, _ = run(t, "fmt", path)
	if code != ExitOK || out != "pipeline \"f\" {\n  key_prefix = \"f\"\n}\n" {
		t.Fatalf("fmt: exit %d, out %q", code, out)
	}
	if code, _, _ = run(t, "fmt", "-w", path); code != ExitOK {
		t.Fatalf("fmt -w: exit %d", code)
	}
	if code, out, _ = run(t, "fmt", "--check", path); code != ExitOK || out != "" {
		t.Fatalf("--check after -w: exit %d, out %q", code, out)
	}
	bad := writePipeline(t, "pipeline \"f\" {\n")
	if code, _, errOut := run(t, "fmt", "--check", bad); code != ExitInvalid || !strings.Contains(errOut, "line 1") {
		t.Fatalf("fmt on a syntax error: exit %d\n%s", code, errOut)
	}
	src, _ := os.ReadFile(bad)
	if string(src) != "pipeline \"f\" {\n" {
		t.Fatal("fmt changed a file it could not parse")
	}
}

func TestFmtCheckExamples(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join(examples, "*"))
	if code, out, errOut := run(t, append([]string{"fmt", "--check"}, paths...)...); code != ExitOK {
		t.Fatalf("exit %d: unformatted examples:\n%s%s", code, out, errOut)
	}
}

func TestGraphFormats(t *testing.T) {
	path := filepath.Join(examples, "fanout")
	for format, want := range map[string]string{
		"dot":     `digraph "clickstream"`,
		"mermaid": "flowchart LR",
		"json":    `"name": "clickstream"`,
	} {
		code, out, errOut := run(t, "graph", "--format", format, path)
		if code != ExitOK || !strings.Contains(out, want) {
			t.Errorf("graph --format %s: exit %d, output lacks %q\n%s", format, code, want, errOut)
		}
	}
	if code, _, errOut := run(t, "graph", "--format", "png", path); code != ExitInvalid || !strings.Contains(errOut, "unknown format") {
		t.Errorf("graph --format png: exit %d\n%s", code, errOut)
	}
}

func TestSchemaMatchesTheCheckedInFile(t *testing.T) {
	code, out, _ := run(t, "schema")
	if code != ExitOK || out != string(schema.JSON) {
		t.Fatalf("flowrun schema differs from schema/flowrun.schema.json (exit %d)", code)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"validate"}, {"nonsense"}, {"validate", "--bogus", "x"}} {
		if code, _, errOut := run(t, args...); code != ExitInvalid || !strings.Contains(errOut, "Error:") {
			t.Errorf("%v: exit %d\n%s", args, code, errOut)
		}
	}
}

// TestValidateChecksTestFiles: validate checks a valid pipeline's test files against it, with their
// own variables, and shows their mistakes with snippets.
func TestValidateChecksTestFiles(t *testing.T) {
	path := writePipeline(t, `pipeline "v" {}
variable "parts" { type = number }
topic "t" { partitions = var.parts }
source "s" {
  kind   = "stdin"
  output = topic.t
}
sink "o" {
  kind  = "stdout"
  input = topic.t
}
`)
	test := filepath.Join(filepath.Dir(path), "p.flowtest.hcl")
	write := func(src string) {
		if err := os.WriteFile(test, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("variables {\n  parts = 2\n}\n\nrun \"r\" {\n  expect {\n    sink  = sink.o\n    count = 0\n  }\n}\n")
	code, out, errOut := run(t, "validate", "--var", "parts=1", path)
	if code != ExitOK || !strings.Contains(out, "1 test file") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}

	write("variables {\n  parts = 2\n}\n\nrun \"r\" {\n  expect {\n    sink  = sink.oo\n    count = 0\n  }\n}\n")
	code, _, errOut = run(t, "validate", "--var", "parts=1", path)
	if code != ExitInvalid {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	for _, want := range []string{
		"Error: Reference to undeclared sink",
		"on " + test + " line 7",
		"7:     sink  = sink.oo",
		`There is no sink named "oo". Did you mean "o"?`,
		"1 error",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}

	code, out, _ = run(t, "validate", "--json", "--var", "parts=1", path)
	var report validateReport
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != ExitInvalid {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if report.Valid || report.ErrorCount != 1 || len(report.Pipelines[0].Tests) != 1 || report.Pipelines[0].Tests[0] != test {
		t.Fatalf("report = %+v", report)
	}
	if d := report.Diagnostics[0]; d.Snippet == nil || !strings.Contains(d.Snippet.Code, "sink.oo") {
		t.Fatalf("diagnostic = %+v", d)
	}

	// The test file itself: validated with its pipeline, the directory it is in.
	code, _, errOut = run(t, "validate", "--var", "parts=1", test)
	if code != ExitInvalid || !strings.Contains(errOut, `There is no sink named "oo"`) {
		t.Fatalf("validate %s: exit %d\n%s", test, code, errOut)
	}
}
