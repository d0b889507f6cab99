package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The flowrun side of the flows: identity pipelines of k map stages (a map without set or drop
// passes messages on unchanged and never decodes them), each with a retry policy and a dead-letter
// topic that the benchmark never triggers, every topic with one partition like the raw streams.

const fwPrefix = "fb"

// fwStream is the Redis stream of partition 0 of a topic of the benchmark pipelines.
func fwStream(topic string) string { return fwPrefix + ":{" + topic + ":0}" }

// fwTopics returns the topics a k-stage pipeline's messages go through: in, t1 ... t(k-1), out.
func fwTopics(k int) []string {
	topics := []string{"in"}
	for i := 1; i < k; i++ {
		topics = append(topics, fmt.Sprintf("t%d", i))
	}
	return append(topics, "out")
}

// pipelineHCL returns the pipeline of k identity stages; eo makes every stage effectively-once.
func pipelineHCL(k int, eo bool) string {
	var b strings.Builder
	b.WriteString("# Written by flowbench: an identity pipeline for benchmarks.\n")
	fmt.Fprintf(&b, "pipeline \"bench\" {\n  key_prefix = %q\n", fwPrefix)
	if eo {
		b.WriteString("  delivery   = \"effectively_once\"\n")
	}
	b.WriteString("}\n\n")
	b.WriteString("retry \"bench\" {\n  max_attempts = 3\n  backoff      = \"exponential\"\n  initial      = \"100ms\"\n  max          = \"1s\"\n}\n\n")
	topics := fwTopics(k)
	for _, t := range append(topics, "failed") {
		fmt.Fprintf(&b, "topic %q {\n  partitions = 1\n}\n\n", t)
	}
	for i := 1; i <= k; i++ {
		fmt.Fprintf(&b, "stage \"s%d\" {\n  kind        = \"map\"\n  input       = topic.%s\n  output      = topic.%s\n"+
			"  retry       = retry.bench\n  dead_letter = topic.failed\n}\n\n", i, topics[i-1], topics[i])
	}
	return b.String()
}

// writePipelines writes the pipelines the scenarios use into dir.
func writePipelines(dir string) (map[string]string, error) {
	files := map[string]string{}
	for _, p := range []struct {
		name string
		k    int
		eo   bool
	}{{"fw1", 1, false}, {"fw3", 3, false}, {"fw3-eo", 3, true}} {
		path := filepath.Join(dir, p.name+".hcl")
		if err := os.WriteFile(path, []byte(pipelineHCL(p.k, p.eo)), 0o644); err != nil {
			return nil, err
		}
		files[p.name] = path
	}
	return files, nil
}
