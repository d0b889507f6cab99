package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// TestJobPipeline: the job scenarios' pipeline compiles to the five hops they describe, every topic
// with 4 partitions and a key.
func TestJobPipeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.hcl")
	if err := os.WriteFile(path, []byte(jobPipelineHCL()), 0o644); err != nil {
		t.Fatal(err)
	}
	plan, _, diags := flow.Build(path, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatalf("the job pipeline does not compile: %s\n%s", diags.Error(), jobPipelineHCL())
	}
	if len(plan.Sources)+len(plan.Stages)+len(plan.Sinks) != jobHops || len(plan.Stages) != 3 {
		t.Errorf("%d sources, %d stages, %d sinks; want 1, 3, 1", len(plan.Sources), len(plan.Stages), len(plan.Sinks))
	}
	if len(plan.Topics) != 4 {
		t.Errorf("%d topics, want 4", len(plan.Topics))
	}
	for _, tp := range plan.Topics {
		if tp.Partitions != 4 || tp.Key == nil {
			t.Errorf("topic %s: %d partitions, key %v; want 4 and a key", tp.Name, tp.Partitions, tp.Key != nil)
		}
	}
}

// TestJobLogTimes reads the two log lines a job's timings come from.
func TestJobLogTimes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.log")
	log := `flowrun: something first
time=2026-12-01T20:41:54.120Z level=INFO msg="pipeline starting" pipeline=job process=x nodes=5 partitions=17 job=true
time=2026-12-01T20:41:54.258Z level=DEBUG msg="partition taken" pipeline=job node=out
time=2026-12-01T20:41:54.287Z level=INFO msg="all work done" pipeline=job
time=2026-12-01T20:41:54.289Z level=INFO msg="pipeline stopped" pipeline=job elapsed=38ms
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	starting, done, err := jobLogTimes(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := done.Sub(starting); got != 167*time.Millisecond {
		t.Errorf("all work done %s after pipeline starting, want 167ms", got)
	}
	if err := os.WriteFile(path, []byte("time=2026-12-01T20:41:54.120Z level=INFO msg=\"pipeline starting\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := jobLogTimes(path); err == nil {
		t.Error("a log without \"all work done\" gave timings")
	}
}
