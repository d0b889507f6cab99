package flowtest

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// JSONReporter writes `flowrun test -json`: one JSON object a line, an event per finished run and
// a summary at the end, for tools to read while the tests run.
//
// A run event:
//
//	{"event":"run", "file":"tests/orders.flowtest.hcl", "run":"happy path",
//	 "status":"pass"|"fail", "wall_ms":12.3, "virtual_ms":90000, "seed":42,
//	 "failures":[{"file":..., "line":7, "column":3, "summary":"...", "diff":"...", "why":["..."]}],
//	 "error":"..."}
//
// failures is [] when the run passed; a failure's file, line and column are where its block is
// written (file "" and line 0 when it has no place), diff is omitted when empty and why is [] when
// nothing is known. error is present only when the run could not be carried out; status is then
// "fail". wall_ms is real time and virtual_ms time on the run's virtual clock, both in milliseconds
// with fractions.
//
// The summary event, last:
//
//	{"event":"summary", "passed":3, "failed":1, "runs":4, "files":2, "wall_ms":400.5}
//
// where wall_ms is the sum of the runs' wall times. Strings are not HTML-escaped (<, >, & stay as
// they are). Run may be called from several goroutines; events do not interleave.
type JSONReporter struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error
}

// NewJSONReporter returns a reporter that writes events to w.
func NewJSONReporter(w io.Writer) *JSONReporter {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &JSONReporter{enc: enc}
}

type jsonRunEvent struct {
	Event     string        `json:"event"`
	File      string        `json:"file"`
	Run       string        `json:"run"`
	Status    string        `json:"status"`
	WallMS    float64       `json:"wall_ms"`
	VirtualMS float64       `json:"virtual_ms"`
	Seed      int64         `json:"seed"`
	Failures  []jsonFailure `json:"failures"`
	Error     string        `json:"error,omitempty"`
}

type jsonFailure struct {
	File    string   `json:"file"`
	Line    int      `json:"line"`
	Column  int      `json:"column"`
	Summary string   `json:"summary"`
	Diff    string   `json:"diff,omitempty"`
	Why     []string `json:"why"`
}

type jsonSummaryEvent struct {
	Event  string  `json:"event"`
	Passed int     `json:"passed"`
	Failed int     `json:"failed"`
	Runs   int     `json:"runs"`
	Files  int     `json:"files"`
	WallMS float64 `json:"wall_ms"`
}

// Run writes the event of one finished run.
func (j *JSONReporter) Run(r *RunResult) {
	ev := jsonRunEvent{
		Event: "run", File: r.File, Run: r.Run, Status: "pass",
		WallMS: millis(r.Wall), VirtualMS: millis(r.Virtual), Seed: r.Seed,
		Failures: []jsonFailure{},
	}
	if !r.Passed() {
		ev.Status = "fail"
	}
	for _, f := range r.Failures {
		why := f.Why
		if why == nil {
			why = []string{}
		}
		ev.Failures = append(ev.Failures, jsonFailure{
			File: f.Range.Filename, Line: f.Range.Start.Line, Column: f.Range.Start.Column,
			Summary: f.Summary, Diff: f.Diff, Why: why,
		})
	}
	if r.Err != nil {
		ev.Error = r.Err.Error()
	}
	j.write(ev)
}

// Done writes the summary event after the last run.
func (j *JSONReporter) Done(results []*RunResult) {
	ev := jsonSummaryEvent{Event: "summary", Runs: len(results)}
	files := map[string]bool{}
	var wall time.Duration
	for _, r := range results {
		if r.Passed() {
			ev.Passed++
		} else {
			ev.Failed++
		}
		files[r.File] = true
		wall += r.Wall
	}
	ev.Files = len(files)
	ev.WallMS = millis(wall)
	j.write(ev)
}

// Err returns the first error writing an event, so that the command can exit non-zero when its
// output was lost.
func (j *JSONReporter) Err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

func (j *JSONReporter) write(ev any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.enc.Encode(ev); err != nil && j.err == nil {
		j.err = err
	}
}

// millis is a duration in milliseconds, to the microsecond.
func millis(d time.Duration) float64 {
	return float64(d.Round(time.Microsecond)) / float64(time.Millisecond)
}
