package flowtest_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/runtime/flowtest"
	"github.com/flowrun/flowrun/stages"
)

const examplesDir = "../../examples/pipelines"

// TestEveryExampleShipsPassingTests runs the test files of every example pipeline, as
// `flowrun test examples/pipelines/*` does: with its chains fused, and again with every stage in a
// hop of its own, expecting the same outputs.
func TestEveryExampleShipsPassingTests(t *testing.T) {
	entries, err := os.ReadDir(examplesDir)
	if err != nil {
		t.Fatal(err)
	}
	examples := 0
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() && (flow.IsTestFile(name) || !(strings.HasSuffix(name, ".hcl") || strings.HasSuffix(name, ".hcl.json"))) {
			continue
		}
		examples++
		path := filepath.Join(examplesDir, e.Name())
		t.Run(e.Name(), func(t *testing.T) {
			tests, files, diags := testfile.LoadAndCheck(path, flow.Options{GoFuncs: stages.Names()})
			if diags.HasErrors() {
				t.Fatalf("invalid: %s", diags.Error())
			}
			if len(tests) == 0 {
				t.Fatalf("example %s has no test files: each example ships tests of its happy and failure paths", path)
			}
			for _, tf := range tests {
				for _, noFusion := range []bool{false, true} {
					var log lockedBuffer // the runtime's goroutines may still log as the run ends
					results := flowtest.RunFile(context.Background(), tf, tf.Plan, flowtest.Options{Seed: 1, NoFusion: noFusion, Log: &log})
					// The harness tells when the pipeline is idle from the runtime's own accounting of
					// its work: a count that never comes back to zero makes every step wait out
					// settleGiveUp (a takeover counted its batch twice, and a crash run took 10 s).
					if strings.Contains(log.String(), "still works after a long wait") {
						t.Errorf("%s (no fusion: %v): the harness waited out a pipeline that said it still worked:\n%s",
							tf.Path, noFusion, lastLines(log.String(), 20))
					}
					if len(results) != len(tf.Runs) {
						t.Errorf("%s (no fusion: %v): %d results for %d runs", tf.Path, noFusion, len(results), len(tf.Runs))
					}
					for _, r := range results {
						if !r.Passed() {
							var out bytes.Buffer
							if err := flowtest.WriteText(&out, r, files, true); err != nil {
								t.Fatal(err)
							}
							t.Errorf("no fusion: %v\n%s", noFusion, out.String())
						}
					}
				}
			}
		})
	}
	if examples < 5 {
		t.Fatalf("found %d example pipelines, want at least 5", examples)
	}
}

// TestAFailingTestFileReportsEveryFailureWhereItIsWritten runs testdata/failing, whose header says
// what must fail and where.
func TestAFailingTestFileReportsEveryFailureWhereItIsWritten(t *testing.T) {
	tests, files, diags := testfile.LoadAndCheck("testdata/failing", flow.Options{})
	if diags.HasErrors() || len(tests) != 1 {
		t.Fatalf("want one valid test file: %s", diags.Error())
	}
	results := flowtest.RunFile(context.Background(), tests[0], tests[0].Plan, flowtest.Options{Seed: 1})
	if len(results) != 2 || !results[0].Passed() || results[1].Passed() {
		t.Fatalf("want run 1 to pass and run 2 to fail: %+v", results)
	}
	var lines []int
	for _, f := range results[1].Failures {
		lines = append(lines, f.Range.Start.Line)
	}
	if len(lines) != 3 || lines[0] != 30 || lines[1] != 34 || lines[2] != 38 {
		t.Errorf("failures at lines %v, want 30, 34 and 38", lines)
	}
	var out bytes.Buffer
	if err := flowtest.WriteText(&out, results[1], files, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`- key=a {"doubled":5,"id":"a","n":2}`, `+ key=a {"doubled":4,"id":"a","n":2}`,
		"the stage passes two messages on", "line 30",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestStatefulStagesUnderTest runs testdata/dedupe: a dedupe stage's duplicates, a key forgotten as
// the watermark passes it (within one batch or across two: the same answer), a key remembered
// through a crash; testdata/repartition: an aggregate behind a repartition topic, whose
// watermark is the slowest of its writers', so that a fast partition does not make a slow one's
// events late; testdata/sessions: session windows (their bounds, a view that merges two sessions,
// late views, a session open through a crash); testdata/bounded: max_keys (a third key
// dead-lettered, the count through a crash, a place freed when a key is forgotten or a group's
// windows close); testdata/late: what the counters say of a late message and a duplicate that
// are dropped, dead-lettered or passed on; and testdata/updates: every on_update emit of an
// effectively-once aggregate, though two batches end at the same event time; testdata/tables: a
// global table's ttl on the virtual clock (a key forgotten ten minutes after its last update, in its
// entries' time; its timer through a crash).
func TestStatefulStagesUnderTest(t *testing.T) {
	for _, dir := range []string{"testdata/dedupe", "testdata/repartition", "testdata/sessions", "testdata/bounded", "testdata/late", "testdata/updates", "testdata/tables"} {
		tests, files, diags := testfile.LoadAndCheck(dir, flow.Options{})
		if diags.HasErrors() || len(tests) != 1 {
			t.Fatalf("%s: want one valid test file: %s", dir, diags.Error())
		}
		for _, r := range flowtest.RunFile(context.Background(), tests[0], tests[0].Plan, flowtest.Options{Seed: 1}) {
			if !r.Passed() {
				var out bytes.Buffer
				if err := flowtest.WriteText(&out, r, files, true); err != nil {
					t.Fatal(err)
				}
				t.Error(out.String())
			}
		}
	}
}

// TestCountersAddUpUnderTest: in testdata/counters, every node's counters (metrics.NODE) add up,
// through a filter, a fan-out, a retry from the retry set, dead letters at a stage and at a sink,
// a duplicate and a late order dropped, and a crash while the sink's batch is at work.
func TestCountersAddUpUnderTest(t *testing.T) {
	tests, files, diags := testfile.LoadAndCheck("testdata/counters", flow.Options{})
	if diags.HasErrors() || len(tests) != 1 {
		t.Fatalf("want one valid test file: %s", diags.Error())
	}
	for _, r := range flowtest.RunFile(context.Background(), tests[0], tests[0].Plan, flowtest.Options{Seed: 1}) {
		if !r.Passed() {
			var out bytes.Buffer
			if err := flowtest.WriteText(&out, r, files, true); err != nil {
				t.Fatal(err)
			}
			t.Error(out.String())
		}
	}
}

// lockedBuffer is a bytes.Buffer that goroutines may write while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
