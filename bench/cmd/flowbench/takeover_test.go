package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestTakeoverPipeline builds the TAKEOVER scenario's pipeline: the lease keys the harness watches
// are every unit's, 37 of them, as the runtime names them (a reader of each partition of its
// input).
func TestTakeoverPipeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "takeover.hcl")
	if err := os.WriteFile(path, []byte(takeoverHCL()), 0o644); err != nil {
		t.Fatal(err)
	}
	plan, _, diags := flow.Build(path, flow.Options{})
	if diags.HasErrors() {
		t.Fatalf("the pipeline does not compile: %s\n%s", diags.Error(), takeoverHCL())
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	var want []string
	add := func(name string, input *flow.Topic) {
		for p := range input.Partitions {
			want = append(want, keys.Lease(input.Name, p, name))
		}
	}
	for _, s := range plan.Stages {
		add(s.Name, s.Input)
	}
	for _, s := range plan.Sinks {
		add(s.Name, s.Input)
	}
	got := takeoverUnits()
	slices.Sort(want)
	slices.Sort(got)
	if len(got) != 37 || !slices.Equal(got, want) {
		t.Errorf("the harness watches %d lease keys %v, want the pipeline's 37 units %v", len(got), got, want)
	}
}
