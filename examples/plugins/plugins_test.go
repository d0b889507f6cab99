package plugins_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
)

// TestCustomBinary builds the example's custom flowrun and runs the pipeline that uses its Go stage
// function and its sink kind, on a real Redis.
func TestCustomBinary(t *testing.T) {
	dir := t.TempDir()
	custom := filepath.Join(dir, "flowrun-acme")
	stock := filepath.Join(dir, "flowrun")
	for bin, pkg := range map[string]string{custom: "./flowrun-acme", stock: "../../cmd/flowrun"} {
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race") // make test: the binaries run with the race detector too
		}
		if out, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}

	out, err := run(t, stock, "validate", "pipeline")
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), `No Go stage function "acme.score"`) {
		t.Fatalf("stock flowrun validate: exit %d\n%s", code, out)
	}
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), `"acme_csv"`) {
		t.Fatalf("stock flowrun validate accepts the acme_csv kind: exit %d\n%s", code, out)
	}
	if out, err := run(t, custom, "version"); err != nil || !strings.Contains(string(out), "acme.score") || !strings.Contains(string(out), "acme.velocity") {
		t.Fatalf("flowrun-acme version: %v\n%s", err, out)
	}
	// The custom kind is documented like a built-in one, and only by the binary that has it.
	stockKinds, customKinds := sinkKinds(t, stock), sinkKinds(t, custom)
	if len(customKinds) != len(stockKinds)+1 || !slices.Contains(customKinds, "acme_csv") || slices.Contains(stockKinds, "acme_csv") {
		t.Fatalf("sink kinds in the schema: flowrun %v, flowrun-acme %v", stockKinds, customKinds)
	}
	if out, err := run(t, custom, "schema", "--format", "markdown"); err != nil || !strings.Contains(string(out), "Appends chosen fields of each message as a CSV row") {
		t.Fatalf("flowrun-acme schema --format markdown does not document acme_csv: %v\n%s", err, out)
	}

	// The pipeline's test files run with the real acme.score and with mocks of it; the stock flowrun
	// cannot run them, as it has no acme_csv kind.
	if out, err := run(t, custom, "test", "pipeline"); err != nil || !strings.Contains(string(out), " 0 failed") {
		t.Fatalf("flowrun-acme test pipeline: exit %d\n%s", exitCode(err), out)
	}
	if out, err := run(t, stock, "test", "pipeline"); exitCode(err) != 2 || !strings.Contains(string(out), `"acme_csv"`) {
		t.Fatalf("stock flowrun test pipeline: exit %d, want 2\n%s", exitCode(err), out)
	}

	srv := redistest.Start(t)
	result := filepath.Join(dir, "risky.jsonl")
	sheet := filepath.Join(dir, "risky.csv")
	bursts := filepath.Join(dir, "bursts.jsonl")
	out, err = run(t, custom, "run", "pipeline", "--until-drained", "--redis", srv.URL(), "--var", "output="+result, "--var", "sheet="+sheet,
		"--var", "bursts="+bursts)
	// Order 5 has no numeric amount: acme.score fails it for good, so the job ends with exit status 3.
	if code := exitCode(err); code != 3 {
		t.Fatalf("flowrun-acme run: exit %d, want 3\n%s", code, out)
	}
	data, err := os.ReadFile(result)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var order struct {
			ID   json.Number `json:"id"`
			Risk float64     `json:"risk"`
		}
		if err := json.Unmarshal([]byte(line), &order); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, order.ID.String())
	}
	sort.Strings(ids)
	// Risk: amount/20, +50 in XX and ZZ, at most 100: orders 2 (100), 3 (52), 6 (100); 4 is 49.5 → 50.
	if got := strings.Join(ids, ","); got != "2,3,4,6" {
		t.Fatalf("risky orders %s, want 2,3,4,6\n%s", got, out)
	}
	rows, err := csv.NewReader(bytes.NewReader(must(os.ReadFile(sheet)))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 || strings.Join(rows[0], ",") != "id,customer,risk" {
		t.Fatalf("the sheet has no header row: %q", rows)
	}
	var sheetIDs []string
	for _, r := range rows[1:] {
		sheetIDs = append(sheetIDs, r[0])
	}
	sort.Strings(sheetIDs)
	if got := strings.Join(sheetIDs, ","); got != "2,3,4,6" {
		t.Fatalf("rows of the sheet %s, want 2,3,4,6: %q", got, rows)
	}

	// acme.velocity, a stateful function, passes on the second order of each customer who orders
	// twice (all the sample's orders are written within ten minutes): alice's 4 and bob's 7.
	var burstIDs []string
	for _, line := range strings.Split(strings.TrimSpace(string(must(os.ReadFile(bursts)))), "\n") {
		var order struct {
			ID     json.Number `json:"id"`
			Recent int         `json:"recent_orders"`
		}
		if err := json.Unmarshal([]byte(line), &order); err != nil {
			t.Fatal(err)
		}
		burstIDs = append(burstIDs, fmt.Sprintf("%s:%d", order.ID, order.Recent))
	}
	sort.Strings(burstIDs)
	if got := strings.Join(burstIDs, ","); got != "4:2,7:2" {
		t.Fatalf("order bursts %s, want orders 4 and 7 with recent_orders 2\n%s", got, out)
	}
	// Its memory of the five customers is state of their partitions in Redis, with a timer each.
	out, err = run(t, custom, "inspect", "pipeline", "--redis", srv.URL(), "--json")
	if err != nil {
		t.Fatalf("flowrun-acme inspect: %v\n%s", err, out)
	}
	var report struct {
		State []struct {
			Stage        string
			Keys, Timers int64
		}
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatal(err)
	}
	var customers, timers int64
	for _, s := range report.State {
		if s.Stage == "velocity" {
			customers, timers = customers+s.Keys, timers+s.Timers
		}
	}
	if customers != 5 || timers != 5 {
		t.Fatalf("the velocity stage remembers %d customers with %d timers, want 5 and 5\n%s", customers, timers, out)
	}
}

// sinkKinds lists the sink kinds of a binary's JSON Schema.
func sinkKinds(t *testing.T, bin string) []string {
	t.Helper()
	out, err := run(t, bin, "schema")
	if err != nil {
		t.Fatalf("%s schema: %v\n%s", bin, err, out)
	}
	// properties.sink.anyOf[0] is the object of sink blocks by name: one if/then per kind.
	var schema struct {
		Properties struct {
			Sink struct {
				AnyOf []struct {
					AdditionalProperties struct {
						AllOf []struct {
							If struct {
								Properties struct {
									Kind struct{ Const string }
								}
							}
						}
					}
				}
			}
		}
	}
	if err := json.Unmarshal(out, &schema); err != nil || len(schema.Properties.Sink.AnyOf) == 0 {
		t.Fatalf("%s schema: %v\n%s", bin, err, out)
	}
	var kinds []string
	for _, k := range schema.Properties.Sink.AnyOf[0].AdditionalProperties.AllOf {
		kinds = append(kinds, k.If.Properties.Kind.Const)
	}
	return kinds
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// run runs a command and returns its output. It fails the test when the command is still running
// after two minutes (it is killed), so that a regression does not hang the test binary, and when
// the command reports a data race.
func run(t *testing.T, bin string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: still running after 2 minutes, killed\n%s", filepath.Base(bin), strings.Join(args, " "), out)
	}
	if bytes.Contains(out, []byte("WARNING: DATA RACE")) {
		t.Fatalf("%s %s: a data race\n%s", filepath.Base(bin), strings.Join(args, " "), out)
	}
	return out, err
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
