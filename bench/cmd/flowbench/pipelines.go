package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The flowrun side of the flows: pipelines of k stages in a chain, each with a retry policy and a
// dead-letter topic that the benchmark never triggers, every topic with one partition like the raw
// streams. FW-k's stages are identity maps (a map without set or drop passes messages on unchanged
// and never decodes them); the stateful scenarios have one stage of their kind instead.

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

// benchPipeline is a pipeline of the scenarios: k stages of one kind.
type benchPipeline struct {
	name  string
	k     int
	eo    bool   // every stage effectively-once
	inKey string // the key expression of the input topic, "" for none
	kind  string // of every stage
	attrs string // the kind's own attributes, as HCL lines
	extra string // more blocks (a lookup's table), as HCL
	src   string // the whole source, written elsewhere (benthos.go), instead of the above
}

// aggregateAttrs count and sum per key (the input topic's) in tumbling windows of a second of
// event time; grace covers the disorder of the harness's four publishers, so that no event is late.
const aggregateAttrs = `  group_by    = msg.key
  event_time  = msg.at
  window {
    type = "tumbling"
    size = "1s"
  }
  grace = "1s"
  aggregate = {
    messages = count()
    amount   = sum(msg.amount)
  }
`

// dedupeAttrs pass on the first message of each id and drop the repeats (one in dupEvery).
const dedupeAttrs = `  key         = msg.id
  within      = "1h"
  event_time  = msg.at
`

// lookupAttrs look each message's key up in the table of lookupTable, and add its row at msg.row.
const lookupAttrs = `  table       = table.keys
  key         = msg.key
  as          = "row"
`

// lookupTable is a table of a row for each of the aggKeys keys, k0000 to k0999, which a generate
// source writes as the process starts: well before the flat-out phase, every lookup finds its row.
const lookupTable = `topic "keys" {
  partitions = 1
  key        = msg.key
}

source "keys" {
  kind   = "generate"
  count  = 1000
  output = topic.keys
  template = {
    key  = format("k%04d", index)
    tier = "gold"
  }
}

table "keys" {
  input = topic.keys
}

`

// rateLimitAttrs limit each key (aggKeys of them) to a rate far above what a key gets, so that no
// message waits: the scenario measures what taking a turn costs (a script call per message).
const rateLimitAttrs = `  key         = msg.key
  rate        = 1000000
  per         = "1s"
  burst       = 1000
`

var benchPipelines = []benchPipeline{
	{name: "fw1", k: 1, kind: "map"}, // identity: a map without set or drop
	{name: "fw3", k: 3, kind: "map"},
	{name: "fw3-eo", k: 3, eo: true, kind: "map"},
	{name: "fw1-aggregate", k: 1, inKey: "msg.key", kind: "aggregate", attrs: aggregateAttrs},
	{name: "fw1-dedupe", k: 1, inKey: "msg.id", kind: "dedupe", attrs: dedupeAttrs},
	{name: "fw1-lookup", k: 1, kind: "lookup", attrs: lookupAttrs, extra: lookupTable},
	{name: "fw1-rate-limit", k: 1, kind: "rate_limit", attrs: rateLimitAttrs},
	{name: "fw1-join", k: 3, src: joinHCL}, // k: its stages, the two sides' and the join
}

// joinHCL joins the input with itself by seq (each message's own, no two alike): each message is
// read by both sides' stages, meets itself in the join's state, and comes out once, as a row of
// its ts and seq (what the final consumer reads, decoding it: readChanged). Three hops, then: the
// two sides' repartition stages and the join.
const joinHCL = `# Written by flowbench: a join of the input with itself.
pipeline "bench" {
  key_prefix = "fb"
}
topic "in" { partitions = 1 }
topic "out" { partitions = 1 }
stage "s1" {
  kind   = "join"
  output = topic.out
  left {
    input      = topic.in
    key        = msg.seq
    event_time = msg.at
  }
  right {
    input      = topic.in
    key        = msg.seq
    event_time = msg.at
  }
  grace  = "1s" # the disorder of the harness's four publishers, as the aggregate's
  select = { ts = left.ts, seq = left.seq }
}
`

// hcl returns the pipeline's source.
func (p benchPipeline) hcl() string {
	if p.src != "" {
		return p.src
	}
	var b strings.Builder
	b.WriteString("# Written by flowbench: a pipeline for benchmarks.\n")
	fmt.Fprintf(&b, "pipeline \"bench\" {\n  key_prefix = %q\n", fwPrefix)
	if p.eo {
		b.WriteString("  delivery   = \"effectively_once\"\n")
	}
	b.WriteString("}\n\n")
	b.WriteString("retry \"bench\" {\n  max_attempts = 3\n  backoff      = \"exponential\"\n  initial      = \"100ms\"\n  max          = \"1s\"\n}\n\n")
	topics := fwTopics(p.k)
	for _, t := range append(topics, "failed") {
		fmt.Fprintf(&b, "topic %q {\n  partitions = 1\n", t)
		if t == "in" && p.inKey != "" {
			// A stateful stage keeps each key's state in one partition: its input is keyed by
			// what it groups or compares by (the harness writes the entries itself, payload only).
			fmt.Fprintf(&b, "  key        = %s\n", p.inKey)
		}
		b.WriteString("}\n\n")
	}
	b.WriteString(p.extra)
	for i := 1; i <= p.k; i++ {
		fmt.Fprintf(&b, "stage \"s%d\" {\n  kind        = %q\n  input       = topic.%s\n  output      = topic.%s\n"+
			"  retry       = retry.bench\n  dead_letter = topic.failed\n%s}\n\n", i, p.kind, topics[i-1], topics[i], p.attrs)
	}
	return b.String()
}

// writePipelines writes the pipelines the scenarios use into dir.
func writePipelines(dir string) (map[string]string, error) {
	files := map[string]string{}
	for _, p := range benchPipelines {
		path := filepath.Join(dir, p.name+".hcl")
		if err := os.WriteFile(path, []byte(p.hcl()), 0o644); err != nil {
			return nil, err
		}
		files[p.name] = path
	}
	return files, nil
}
