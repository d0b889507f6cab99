package testfile_test

import (
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/internal/fixturetest"
	"github.com/flowrun/flowrun/flow/testfile"
	_ "github.com/flowrun/flowrun/stages" // the built-in kinds
)

var update = flag.Bool("update", false, "rewrite docs/testing-reference.md instead of comparing with it")

// testPipeline is the pipeline that the test-file fixtures test.
const testPipeline = "testdata/pipeline"

// testOptions are the compile options of the fixture tests: a binary with two Go stage functions and
// an empty environment.
var testOptions = flow.Options{
	GoFuncs:   []string{"acme.enrich", "acme.score"},
	LookupEnv: func(string) (string, bool) { return "", false },
}

// checkTestFile loads a test file and checks it against testPipeline compiled with its variables,
// as testfile.LoadAndCheck does for each file it finds.
func checkTestFile(t *testing.T, path string) (*testfile.File, map[string]*hcl.File, hcl.Diagnostics) {
	t.Helper()
	tf, diags := testfile.Load(path)
	opts := testOptions
	opts.Values, opts.ValueRanges = tf.Variables, tf.VariableRanges
	plan, cfg, more := flow.Build(testPipeline, opts)
	diags = append(diags, more...)
	files := map[string]*hcl.File{}
	for _, m := range []map[string]*hcl.File{cfg.Files(), tf.Files()} {
		for n, f := range m {
			files[n] = f
		}
	}
	if plan != nil {
		diags = append(diags, tf.Check(plan)...)
	}
	return tf, files, diags
}

// Each file in testdata/errors is a test file with mistakes, marked as package fixturetest
// describes: every diagnostic expected, located, shown with its snippet.
func TestDiagnosticFixtures(t *testing.T) {
	paths, err := filepath.Glob("testdata/errors/*")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			expectations := fixturetest.ReadExpectations(t, path)
			if len(expectations) == 0 {
				t.Fatalf("%s expects no diagnostic", path)
			}
			_, files, diags := checkTestFile(t, path)
			for _, d := range diags {
				if d.Subject == nil {
					t.Errorf("diagnostic without a location: %s: %s", d.Summary, d.Detail)
					continue
				}
				if !fixturetest.Match(d, expectations) {
					t.Errorf("unexpected diagnostic at %s: %s: %s", d.Subject, d.Summary, d.Detail)
				}
				if d.Subject.Filename == path {
					fixturetest.CheckSnippet(t, d, files)
				}
			}
			fixturetest.ReportUnmet(t, expectations, diags)
		})
	}
}

func TestLoadDecodesEverything(t *testing.T) {
	path := filepath.Join(testPipeline, "shop.flowtest.hcl")
	tf, _, diags := checkTestFile(t, path)
	if len(diags) > 0 {
		t.Fatalf("diagnostics: %s", fixturetest.List(diags))
	}
	if tf.Plan == nil || tf.Plan.Name != "shop" {
		t.Fatalf("Plan = %v", tf.Plan)
	}
	if v := tf.Variables["events"]; !v.RawEquals(cty.NumberIntVal(3)) {
		t.Errorf("events = %#v", v)
	}
	if r := tf.VariableRanges["events"]; r.Start.Line != 3 {
		t.Errorf("events is set at %s", r)
	}
	if n := tf.Plan.Sources[0].Config.Int("count"); n != 3 {
		t.Errorf("the plan compiled with events = %d, want the test's 3", n)
	}

	if len(tf.Mocks) != 1 || tf.Mocks[0].Func != "acme.score" || len(tf.Mocks[0].Results) != 6 {
		t.Fatalf("mocks = %+v", tf.Mocks)
	}
	r := tf.Mocks[0].Results
	if r[0].Error != "scoring service timeout" || r[0].Permanent || r[0].Times != 1 {
		t.Errorf("result 0 = %+v", r[0])
	}
	if r[1].Error != "bad input" || !r[1].Permanent {
		t.Errorf("result 1 = %+v", r[1])
	}
	if !r[2].Drop || r[2].Outputs != nil {
		t.Errorf("result 2 = %+v", r[2])
	}
	if len(r[3].Outputs) != 1 {
		t.Fatalf("result 3 = %+v", r[3])
	}
	if out, err := r[3].Outputs[0].Eval(map[string]any{"id": 21.0}); err != nil || out.(map[string]any)["score"] != 42.0 {
		t.Errorf("output on id 21 = %v, %v", out, err)
	}
	if len(r[4].Outputs) != 2 {
		t.Errorf("result 4 has %d outputs, want 2", len(r[4].Outputs))
	}
	if r[5].Times != 3 || r[5].Outputs != nil || r[5].Drop || r[5].Error != "" {
		t.Errorf("result 5 = %+v", r[5])
	}

	if len(tf.Overrides) != 1 || tf.Overrides[0].Sink != "hook" || !slices.Equal(tf.Overrides[0].Responses, []int{503, 503, 200}) {
		t.Errorf("overrides = %+v", tf.Overrides)
	}

	if len(tf.Runs) != 2 {
		t.Fatalf("%d runs", len(tf.Runs))
	}
	run := tf.Runs[0]
	if run.Name != "happy path" || run.Reset || len(run.Steps) != 3 {
		t.Fatalf("run = %+v", run)
	}
	first := run.Steps[0]
	if first.Range != run.Range || first.Advance != 10*time.Minute || first.Crash || len(first.Expect) != 0 {
		t.Errorf("steps[0] = %+v", first)
	}
	send := first.Sends[0]
	if send.Topic != "orders" || send.Source != "" || send.File != "" || len(send.Messages) != 3 {
		t.Fatalf("send = %+v", send)
	}
	wantMessages := []struct {
		payload, key string
		hasKey       bool
		at           time.Duration
		line         int
	}{
		{`{"amount":5.5,"id":1}`, "", false, 0, 26},
		{`{"id":2}`, "c1", true, 5 * time.Second, 27},
		// extra makes the object a payload, not the wrapped form
		{`{"extra":1,"key":"k","payload":{"id":3}}`, "", false, 0, 28},
	}
	for i, w := range wantMessages {
		m := send.Messages[i]
		if string(m.Payload) != w.payload || m.Key != w.key || m.HasKey != w.hasKey || m.At != w.at || m.Range.Start.Line != w.line {
			t.Errorf("message %d = %s %q %v %v at %s, want %+v", i, m.Payload, m.Key, m.HasKey, m.At, m.Range, w)
		}
	}

	if len(run.Expect) != 2 {
		t.Fatalf("expect = %+v", run.Expect)
	}
	e := run.Expect[0]
	if e.Sink != "out" || e.Topic != "" || !e.HasMessages || string(e.Messages[0].Payload) != `{"id":1}` ||
		e.Match != testfile.MatchUnordered || !e.HasCount || e.Count != 1 {
		t.Errorf("expect 0 = %+v", e)
	}
	e = run.Expect[1]
	if e.Topic != "tag.out" || e.Sink != "" || e.HasMessages || e.Match != testfile.MatchExact ||
		e.File != filepath.Join(testPipeline, "golden", "missing.jsonl") {
		t.Errorf("expect 1 (a missing golden file, stage.tag) = %+v", e)
	}
	dl := run.ExpectDeadLetters[0]
	if dl.NodeType != "stage" || dl.Node != "score" || dl.Count != 1 || !dl.HasCount || len(dl.Messages) != 2 {
		t.Fatalf("dead letters = %+v", dl)
	}
	if m := dl.Messages[0]; string(m.Payload) != `{"id":2}` || m.Reason != "timeout" || m.Attempts != 3 {
		t.Errorf("dead letter 0 = %+v", m)
	}
	if m := dl.Messages[1]; m.Payload != nil || m.Reason != "" || m.Attempts != 0 {
		t.Errorf("dead letter 1 = %+v, want a match of anything", m)
	}
	if a := run.Asserts[0]; a.ErrorMessage != "exactly one order gets out" || a.Condition == nil {
		t.Errorf("assert = %+v", a)
	}

	if s := run.Steps[1]; !s.Crash || len(s.Sends) != 0 || s.Range.Start.Line != 51 {
		t.Errorf("steps[1] = %+v", s)
	}
	s := run.Steps[2]
	if s.Advance != time.Second || len(s.Expect) != 1 || s.Expect[0].Count != 2 || len(s.Asserts) != 1 {
		t.Errorf("steps[2] = %+v", s)
	}
	fileSend := s.Sends[0]
	if fileSend.Source != "orders" || fileSend.File != filepath.Join(testPipeline, "fixtures", "orders.jsonl") || len(fileSend.Messages) != 2 {
		t.Fatalf("file send = %+v", fileSend)
	}
	if m := fileSend.Messages[0]; string(m.Payload) != `{"id":10,"n":1}` || m.HasKey || m.Range.Filename != fileSend.File || m.Range.Start.Line != 1 {
		t.Errorf("file message 0 = %s at %s", m.Payload, m.Range)
	}
	if m := fileSend.Messages[1]; string(m.Payload) != `{"id":11}` || m.Key != "k9" || m.At != 500*time.Millisecond || m.Range.Start.Line != 3 {
		t.Errorf("file message 1 (after a blank line) = %s %q %v at %s", m.Payload, m.Key, m.At, m.Range)
	}

	second := tf.Runs[1]
	if !second.Reset || len(second.Steps) != 1 || len(second.Steps[0].Sends) != 0 {
		t.Errorf("second run = %+v", second)
	}
	golden := second.Expect[0]
	if golden.Topic != "enriched" || !golden.HasMessages || len(golden.Messages) != 2 || golden.Messages[1].Key != "x" {
		t.Errorf("golden expect = %+v", golden)
	}
}

func TestLoadJSONSyntax(t *testing.T) {
	tf, _, diags := checkTestFile(t, filepath.Join(testPipeline, "tests", "shop.flowtest.hcl.json"))
	if len(diags) > 0 {
		t.Fatalf("diagnostics: %s", fixturetest.List(diags))
	}
	results := tf.Mocks[0].Results
	if out, err := results[0].Outputs[0].Eval(map[string]any{"id": 1.0}); err != nil || out.(map[string]any)["score"] != 2.0 {
		t.Errorf("output = %v, %v", out, err)
	}
	if out, err := results[1].Outputs[0].Eval(map[string]any{"id": 1.0}); err != nil || out.(map[string]any)["id"] != 1.0 {
		t.Errorf("outputs[0] = %v, %v", out, err)
	}
	run := tf.Runs[0]
	msgs := run.Steps[0].Sends[0].Messages
	if len(msgs) != 2 || string(msgs[0].Payload) != `{"id":1}` || msgs[1].Key != "k" || string(msgs[1].Payload) != `{"id":2}` {
		t.Errorf("messages = %+v", msgs)
	}
	if run.Steps[0].Advance != time.Second || run.Expect[0].Sink != "out" || len(run.Asserts) != 1 {
		t.Errorf("run = %+v", run)
	}
	ok, diags := run.Asserts[0].Eval(map[string]cty.Value{"output": cty.ObjectVal(map[string]cty.Value{
		"out": cty.TupleVal([]cty.Value{cty.EmptyObjectVal}),
	})})
	if !ok || diags.HasErrors() {
		t.Errorf("the JSON condition = %v, %s", ok, diags)
	}
}

func TestAssertEval(t *testing.T) {
	src := `
run "r" {
  assert { condition = length(output.out) == 2 && metrics.score.retried > 0 }
  assert { condition = output.out }
  assert { condition = output.out[5].id == 1 }
}`
	tf, diags := testfile.LoadSource("a.flowtest.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	scope := map[string]cty.Value{
		"output": cty.ObjectVal(map[string]cty.Value{"out": cty.TupleVal([]cty.Value{
			cty.ObjectVal(map[string]cty.Value{"id": cty.NumberIntVal(1)}), cty.EmptyObjectVal,
		})}),
		"metrics": cty.ObjectVal(map[string]cty.Value{"score": cty.ObjectVal(map[string]cty.Value{"retried": cty.NumberIntVal(2)})}),
	}
	asserts := tf.Runs[0].Asserts
	if ok, diags := asserts[0].Eval(scope); !ok || diags.HasErrors() {
		t.Errorf("a true condition = %v, %s", ok, diags)
	}
	for i, want := range []string{"this one is a tuple", "does not identify an element"} {
		ok, diags := asserts[i+1].Eval(scope)
		if ok || !diags.HasErrors() || diags[0].Subject == nil || diags[0].Subject.Start.Line != 4+i {
			t.Errorf("assert %d = %v, %s", i+1, ok, diags)
			continue
		}
		if !strings.Contains(diags.Error(), want) {
			t.Errorf("assert %d: %s, want %q", i+1, diags, want)
		}
	}
	scope["metrics"] = cty.ObjectVal(map[string]cty.Value{"score": cty.ObjectVal(map[string]cty.Value{"retried": cty.NumberIntVal(0)})})
	if ok, diags := asserts[0].Eval(scope); ok || diags.HasErrors() {
		t.Errorf("a false condition = %v, %s", ok, diags)
	}
}

func TestLoadAndCheckFindsAndChecksEveryFile(t *testing.T) {
	tests, files, diags := testfile.LoadAndCheck(testPipeline, testOptions)
	if len(diags) > 0 {
		t.Fatalf("diagnostics: %s", fixturetest.List(diags))
	}
	if len(tests) != 2 || tests[0].Plan == nil || tests[1].Plan == nil {
		t.Fatalf("tests = %+v", tests)
	}
	for _, want := range []string{filepath.Join(testPipeline, "shop.hcl"), filepath.Join(testPipeline, "shop.flowtest.hcl")} {
		if files[want] == nil {
			t.Errorf("no source for %s", want)
		}
	}
	// Each file's plan has its variables: the first sets events, the second does not.
	if n := tests[0].Plan.Sources[0].Config.Int("count"); n != 3 {
		t.Errorf("count = %d with the first file's variables", n)
	}
	if n := tests[1].Plan.Sources[0].Config.Int("count"); n != 10 {
		t.Errorf("count = %d without variables", n)
	}
}

func TestLoadAndCheckOfOneTestFile(t *testing.T) {
	path := filepath.Join(testPipeline, "tests", "shop.flowtest.hcl.json")
	tests, _, diags := testfile.LoadAndCheck(path, testOptions)
	if len(diags) > 0 || len(tests) != 1 || tests[0].Path != path || tests[0].Plan == nil {
		t.Fatalf("tests %+v, diagnostics %s", tests, fixturetest.List(diags))
	}
}

// TestATestFileNamesTheTopicsItLooksAt: the outputs an assert reads, by name or by index, are the
// file's topics; one it reads by a computed name stands for every topic. (Their links must be
// streams for the test to see them.)
func TestATestFileNamesTheTopicsItLooksAt(t *testing.T) {
	tf, diags := testfile.LoadSource("a.flowtest.hcl", []byte(`
run "r" {
  assert { condition = length(output["a.out"]) == 1 && metrics.b.in == 1 }
  assert { condition = length(output.sink_out) == 1 }
}`))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	got := tf.Topics()
	if !got["a.out"] || !got["sink_out"] || got["b"] || got["in"] || got[flow.AnyTopic] {
		t.Errorf("topics %v, want a.out and sink_out only", got)
	}
	tf, diags = testfile.LoadSource("b.flowtest.hcl", []byte(`
run "r" {
  assert { condition = length(output[join(".", ["a", "out"])]) == 1 }
}`))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if got := tf.Topics(); !got[flow.AnyTopic] {
		t.Errorf("topics %v, want every topic for a name computed at run time", got)
	}
}

func TestReferenceDocsGenerated(t *testing.T) {
	fixturetest.Golden(t, "../../docs/testing-reference.md", testfile.ReferenceMarkdown(), *update)
}
