package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The Benthos peer: the same flows run by Benthos (bin/benthos, which make bench-peers builds from
// the Go module proxy; it is never part of the repository) as a child process, once with every
// setting at its default and once with its best settings for throughput. Two shapes:
//
//   - the 5-hop chain: a stream in, a source hop, 3 filter hops, a sink hop, a stream out. flowrun
//     runs it as a redis_stream source, 3 filter stages over declared 4-partition topics keyed by
//     msg.key, and a redis_stream sink; Benthos as 5 streams in one process (streams mode), each
//     reading one stream and writing the next (Benthos has no partitioned topics).
//   - the shape a Benthos user writes: one input, three processors, one output. flowrun runs it as
//     three filter stages chained with input = stage.X from topic in to topic out, which stage
//     fusion runs in one hop (without fusion, each stage is a hop of its own).

// benthosVersion is the release that make bench-peers builds, and that the scenarios check for.
const benthosVersion = "v4.27.0"

var (
	benthosBin = flag.String("benthos", "bin/benthos", "the Benthos binary for the peer scenarios (make bench-peers builds it); without it they are skipped")
	// Experiments: other values of the tuned set-up's settings, to check that they are its best.
	benthosBatch       = flag.Int("benthos-batch", 1000, "experiment: the tuned Benthos set-up's broker batch count and input limit")
	benthosMaxInFlight = flag.Int("benthos-max-in-flight", 1, "experiment: the tuned Benthos set-up's output max_in_flight")
	benthosThreads     = flag.Int("benthos-threads", 0, "experiment: the tuned Benthos set-up's pipeline threads (0: its default, one per CPU)")
)

// filterWhere passes every message of the harness (amount is 1000 to 9999) after decoding it, in
// flowrun's language and in Bloblang.
const (
	filterWhere     = "msg.amount >= 1000"
	filterBloblang  = `root = if this.amount < 1000 { deleted() }`
	benthosStreamNS = "bb" // the prefix of the Benthos scenarios' streams
	extIn, extOut   = "ext:{in}", "ext:{out}"
)

// The scenarios of this file, after the others of a round, each shape's flowrun flow first.
var peerScenarios = []scenario{
	{name: "FW-5 keyed", kind: kindHops, impl: implFlowrun, stages: 5, pipeline: "fw5-keyed", streams: fixedStreams(extIn, extOut)},
	{name: "Benthos-5 default", kind: kindHops, impl: implBenthos, stages: 5, vs: "FW-5 keyed", fewer: true, streams: benthosChainStreams(5), start: startBenthos(false)},
	{name: "Benthos-5 tuned", kind: kindHops, impl: implBenthos, stages: 5, vs: "FW-5 keyed", streams: benthosChainStreams(5), start: startBenthos(true)},
	{name: "FW-3 chained", kind: kindHops, impl: implFlowrun, stages: 3, pipeline: "fw3-chained", streams: fixedStreams(fwStream("in"), fwStream("out"))},
	{name: "Benthos-3 default", kind: kindHops, impl: implBenthos, stages: 3, vs: "FW-3 chained", fewer: true, streams: benthosChainStreams(1), start: startBenthos(false)},
	{name: "Benthos-3 tuned", kind: kindHops, impl: implBenthos, stages: 3, vs: "FW-3 chained", streams: benthosChainStreams(1), start: startBenthos(true)},
	// The same chain on topics of 4 partitions (the harness writes each message into the partition
	// of its key): flowrun's way to use more cores, where Benthos's is its pipeline threads (one per
	// core by default).
	{name: "FW-3 chained 4p", kind: kindHops, impl: implFlowrun, stages: 3, pipeline: "fw3-chained-4p",
		streams: fixedStreams(partitionStreams("in", 4), partitionStreams("out", 4))},
}

// peerShapes pair each shape's flowrun flow with its two Benthos set-ups, for the report.
var peerShapes = []struct{ shape, fw, def, tuned string }{
	{"5-hop chain (source, 3 filters over keyed topics, sink)", "FW-5 keyed", "Benthos-5 default", "Benthos-5 tuned"},
	{"input, 3 processors, output (flowrun: 3 stages chained with stage.X)", "FW-3 chained", "Benthos-3 default", "Benthos-3 tuned"},
	{"the same, flowrun's topics of 4 partitions", "FW-3 chained 4p", "Benthos-3 default", "Benthos-3 tuned"},
}

func init() {
	scenarios = append(scenarios, peerScenarios...)
	benchPipelines = append(benchPipelines,
		benchPipeline{name: "fw5-keyed", k: 3, src: fw5KeyedHCL()},
		benchPipeline{name: "fw3-chained", k: 3, src: fw3ChainedHCL(1)},
		benchPipeline{name: "fw3-chained-4p", k: 3, src: fw3ChainedHCL(4)},
	)
}

func fixedStreams(s ...string) func() ([]string, format) {
	return func() ([]string, format) { return s, formatPlain }
}

// partitionStreams names the partitions of a topic of the benchmark pipelines as one stream
// argument of the harness's publishers and final consumer (joined by partSep).
func partitionStreams(topic string, partitions int) string {
	var s []string
	for p := range partitions {
		s = append(s, fmt.Sprintf("%s:{%s:%d}", fwPrefix, topic, p))
	}
	return strings.Join(s, partSep)
}

// benthosChainStreams are the streams of a Benthos flow of hops hops: the harness writes the first
// and reads the last.
func benthosChainStreams(hops int) func() ([]string, format) {
	return func() ([]string, format) {
		s := []string{benthosStreamNS + ":{in}"}
		for i := 1; i < hops; i++ {
			s = append(s, fmt.Sprintf("%s:{h%d}", benthosStreamNS, i))
		}
		return append(s, benthosStreamNS+":{out}"), formatPlain
	}
}

const benchRetryHCL = "retry \"bench\" {\n  max_attempts = 3\n  backoff      = \"exponential\"\n  initial      = \"100ms\"\n  max          = \"1s\"\n}\n\n"

func filterStageHCL(name, input, output string) string {
	out := ""
	if output != "" {
		out = fmt.Sprintf("  output      = %s\n", output)
	}
	return fmt.Sprintf("stage %q {\n  kind        = \"filter\"\n  input       = %s\n%s  where       = %s\n"+
		"  retry       = retry.bench\n  dead_letter = topic.failed\n}\n\n", name, input, out, filterWhere)
}

// fw5KeyedHCL is the 5-hop chain: a redis_stream source, 3 filters over declared topics of 4
// partitions keyed by msg.key (declared topics always stay streams), a redis_stream sink.
func fw5KeyedHCL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by flowbench: the 5-hop chain of the Benthos comparison.\npipeline \"bench\" {\n  key_prefix = %q\n}\n\n", fwPrefix)
	b.WriteString(benchRetryHCL)
	fmt.Fprintf(&b, "source \"in\" {\n  kind   = \"redis_stream\"\n  stream = %q\n  output = topic.t0\n}\n\n", extIn)
	for i := range 4 {
		fmt.Fprintf(&b, "topic \"t%d\" {\n  partitions = 4\n  key        = msg.key\n}\n\n", i)
	}
	b.WriteString("topic \"failed\" {\n  partitions = 1\n}\n\n")
	for i := 1; i <= 3; i++ {
		b.WriteString(filterStageHCL(fmt.Sprintf("s%d", i), fmt.Sprintf("topic.t%d", i-1), fmt.Sprintf("topic.t%d", i)))
	}
	fmt.Fprintf(&b, "sink \"out\" {\n  kind   = \"redis_stream\"\n  input  = topic.t3\n  stream = %q\n}\n", extOut)
	return b.String()
}

// fw3ChainedHCL is what a Benthos user's input -> 3 processors -> output is in flowrun: three
// filters chained with stage references, from topic in to topic out (1 partition each, as FW-3, or
// more).
func fw3ChainedHCL(partitions int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by flowbench: three stages chained with stage.X (one hop once fused).\npipeline \"bench\" {\n  key_prefix = %q\n}\n\n", fwPrefix)
	b.WriteString(benchRetryHCL)
	for _, t := range []string{"in", "out"} {
		fmt.Fprintf(&b, "topic %q {\n  partitions = %d\n}\n\n", t, partitions)
	}
	b.WriteString("topic \"failed\" {\n  partitions = 1\n}\n\n")
	b.WriteString(filterStageHCL("s1", "topic.in", ""))
	b.WriteString(filterStageHCL("s2", "stage.s1", ""))
	b.WriteString(filterStageHCL("s3", "stage.s2", "topic.out"))
	return b.String()
}

// benthosPath returns the Benthos binary, or why the Benthos scenarios cannot run.
func benthosPath() (string, string) {
	bin, err := exec.LookPath(*benthosBin)
	if err != nil {
		return "", "skipped: " + *benthosBin + " not built (make bench-peers)"
	}
	return bin, ""
}

// benthosUnavailable says why a Benthos scenario cannot run, or "".
func benthosUnavailable(*harness) string {
	_, why := benthosPath()
	return why
}

// benthosVersionOf returns what bin/benthos says its version is ("" if it says nothing).
func benthosVersionOf(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// benthosConfigs returns the stream configs of a Benthos flow through streams (one per hop: hop i
// reads streams[i-1] and writes streams[i]) and its service-wide config. A flow of one hop is the
// input -> 3 processors -> output shape; in a longer one the first and last hops only move
// messages (the source and the sink) and the others filter.
func benthosConfigs(addr string, httpPort int, streams []string, tuned bool, logPath string) (hops []string, root string) {
	url := "redis://" + addr
	n := len(streams) - 1
	for i := 1; i <= n; i++ {
		var b strings.Builder
		input := fmt.Sprintf("redis_streams:\n  url: %s\n  streams: [ %q ]\n  consumer_group: bb%d\n  body_key: payload\n", url, streams[i-1], i)
		if tuned {
			input += fmt.Sprintf("  limit: %d\n  auto_replay_nacks: false\n", *benthosBatch)
			// Broker batching: the input's messages travel through the processors and to the
			// output in batches of up to 1000, which the output writes in one pipeline.
			input = "broker:\n  inputs:\n    - " + strings.ReplaceAll(strings.TrimSuffix(input, "\n"), "\n", "\n      ") +
				fmt.Sprintf("\n  batching:\n    count: %d\n    period: 10ms\n", *benthosBatch)
		}
		b.WriteString("input:\n  " + strings.ReplaceAll(strings.TrimSuffix(input, "\n"), "\n", "\n  ") + "\n")
		filters := 1
		switch {
		case n == 1:
			filters = 3
		case i == 1 || i == n:
			filters = 0
		}
		if filters > 0 {
			b.WriteString("pipeline:\n")
			if tuned && *benthosThreads > 0 {
				fmt.Fprintf(&b, "  threads: %d\n", *benthosThreads)
			}
			b.WriteString("  processors:\n")
			for range filters {
				fmt.Fprintf(&b, "    - mapping: '%s'\n", filterBloblang)
			}
		}
		fmt.Fprintf(&b, "output:\n  redis_streams:\n    url: %s\n    stream: %q\n    body_key: payload\n", url, streams[i])
		if tuned {
			// One write at a time of each batch, and no metadata fields (the input's entry ID)
			// written with the payload.
			fmt.Fprintf(&b, "    max_in_flight: %d\n    metadata:\n      exclude_prefixes: [ \"\" ]\n", *benthosMaxInFlight)
		}
		hops = append(hops, b.String())
	}
	var r strings.Builder
	fmt.Fprintf(&r, "http:\n  address: 127.0.0.1:%d\n", httpPort)
	fmt.Fprintf(&r, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	if tuned {
		r.WriteString("metrics:\n  none: {}\n")
	}
	return hops, r.String()
}

// startBenthos returns the start of a Benthos flow: one stream in regular mode, or several in
// streams mode, all in one process. The tuned set-up runs with flowrun's GOGC (400, which flowrun
// sets for itself unless GOGC is set).
func startBenthos(tuned bool) func(h *harness, sc scenario, streams []string) (*child, error) {
	return func(h *harness, sc scenario, streams []string) (*child, error) {
		bin, why := benthosPath()
		if why != "" {
			return nil, fmt.Errorf("%s", why)
		}
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		logPath := h.logPath(sc)
		// Benthos logs to this file (appending), which is also the child's standard error.
		hops, root := benthosConfigs(h.srv.addr(), port, streams, tuned, logPath)
		dir, err := os.MkdirTemp(h.tmp, "benthos-")
		if err != nil {
			return nil, err
		}
		write := func(name, body string) (string, error) {
			p := filepath.Join(dir, name)
			return p, os.WriteFile(p, []byte(body), 0o644)
		}
		var args []string
		if len(hops) == 1 {
			// The service-wide sections and the stream in one config, as a Benthos user writes it.
			p, err := write("benthos.yaml", root+hops[0])
			if err != nil {
				return nil, err
			}
			args = []string{"-c", p}
		} else {
			p, err := write("service.yaml", root)
			if err != nil {
				return nil, err
			}
			args = []string{"-c", p, "streams", "--no-api"}
			for i, hop := range hops {
				p, err := write("hop"+strconv.Itoa(i+1)+".yaml", hop)
				if err != nil {
					return nil, err
				}
				args = append(args, p)
			}
		}
		var env []string
		if tuned {
			env = append(env, "GOGC=400")
		}
		return startChild(sc.name, logPath, env, bin, args...)
	}
}

// peersReport is the report's comparison of flowrun with Benthos: per shape, the rates and
// flowrun's rate over each Benthos set-up's (the median of the rounds' ratios, each of a round
// against the same round), and the aim of issue 15 (at least twice tuned Benthos).
func peersReport(sums map[string]summary, results map[string][]result, quick bool) string {
	if _, ok := sums[peerShapes[0].fw]; !ok {
		if _, ok := sums[peerShapes[1].fw]; !ok {
			return ""
		}
	}
	version := benthosVersion
	if bin, why := benthosPath(); why != "" {
		version += " (" + why + ")"
	} else {
		version = benthosVersionOf(bin)
		if version != benthosVersion {
			version += " (not " + benthosVersion + ": rebuild with make bench-peers)"
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nflowrun against Benthos %s (the same rounds; x = flowrun's msg/s over Benthos's; tuned: broker batching of %d, limit %d, "+
		"auto_replay_nacks false, max_in_flight %d, metrics none, no metadata fields, GOGC=400", version, *benthosBatch, *benthosBatch, *benthosMaxInFlight)
	if *benthosThreads > 0 {
		fmt.Fprintf(&b, ", pipeline threads %d", *benthosThreads)
	}
	b.WriteString(")\n\n")
	b.WriteString("| shape | flowrun msg/s | Benthos default msg/s | Benthos tuned msg/s | flowrun / default | flowrun / tuned | aim: >= 2x tuned | CPU us/msg: flowrun, default, tuned |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	// CPU per message through the whole flow (all its hops): on a busy machine, where the rates
	// depend on the share of the cores each process gets, the steadier figure.
	cpu := func(names ...string) string {
		var out []string
		for _, name := range names {
			s, ok := sums[name]
			if !ok || s.ok == 0 {
				out = append(out, "-")
				continue
			}
			stages := 1
			for _, sc := range peerScenarios {
				if sc.name == name {
					stages = sc.stages
				}
			}
			out = append(out, fmt.Sprintf("%.1f", s.cpu*float64(stages)/1000))
		}
		return strings.Join(out, ", ")
	}
	rate := func(name string) string {
		s, ok := sums[name]
		switch {
		case !ok:
			return "not run"
		case s.ok == 0 && s.failed != "":
			return "FAILED"
		case s.ok == 0:
			return mdEscape(s.na)
		}
		return fmt.Sprintf("%.0f", s.rate)
	}
	for _, p := range peerShapes {
		if _, ok := sums[p.fw]; !ok {
			continue
		}
		def, okd := peerRatio(results, p.fw, p.def)
		tuned, okt := peerRatio(results, p.fw, p.tuned)
		x := func(r float64, ok bool) string {
			if !ok {
				return ""
			}
			return fmt.Sprintf("%.2fx", r)
		}
		verdict := "n/a"
		switch {
		case quick:
			verdict = "not judged in quick mode"
		case okt && tuned >= 2:
			verdict = "met"
		case okt:
			verdict = "NOT met"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", p.shape, rate(p.fw), rate(p.def), rate(p.tuned), x(def, okd), x(tuned, okt), verdict,
			cpu(p.fw, p.def, p.tuned))
	}
	return b.String()
}

// peerRatio is the median over the rounds of fw's rate over peer's in the same round.
func peerRatio(results map[string][]result, fw, peer string) (float64, bool) {
	var ratios []float64
	f, p := results[fw], results[peer]
	for i := range min(len(f), len(p)) {
		if f[i].ok() && p[i].ok() && p[i].rate > 0 {
			ratios = append(ratios, f[i].rate/p[i].rate)
		}
	}
	if len(ratios) == 0 {
		return 0, false
	}
	return median(ratios), true
}
