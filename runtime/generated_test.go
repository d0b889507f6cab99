package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/modeltest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

var (
	drawsFlag = flag.Int("draws", 32, "TestGeneratedPipelines: how many pipelines to draw")
	seedFlag  = flag.Uint64("seed", 0, "TestGeneratedPipelines: run only the draw of this seed (as a failure prints it)")
	keepFlag  = flag.String("keep", "", "TestGeneratedPipelines: keep each draw's files (pipeline, inputs, the model's outputs) under this directory, to run by hand")
	soakFlag  = flag.Bool("soak", false, "TestGeneratedPipelines: run every draw as flowrun processes too, with its kills, on a server and a cluster; the connectors' proofs: issue 24's scale (make soak-connectors)")
)

// TestGeneratedPipelines is the proof by drawing (internal/modeltest): random pipelines of
// filters, maps, routes, rate limits, dedupes, aggregates, joins, patterns and lookups (latest, or
// as of an event time, with stateful stages after them), over declared and inserted topics of
// random partitions and keys, with tumbling, hopping and session windows and aggregates of
// aggregates, and a table whose updates (versions, deletes) are written before the run,
// run on random data whose disorder stays within every grace, with a random batch size, fused or
// not, at-least-once or effectively-once. What every sink receives must equal what the reference
// model computes, with nothing late, and nothing dead-lettered but what the model dead-letters (a
// lookup's missing keys).
//
// Each draw runs as a job in this process on the embedded Redis and on a real redis-server. The
// draws that name kills also run as flowrun processes on the server: one or two processes share
// the partitions, a process is killed with SIGKILL at each of the draw's points of the input, and
// a last one runs the job to its end. Under at-least-once a kill may deliver a message twice, so
// there the check is that nothing is lost. With -soak every draw runs so, on the cluster too.
//
// The draws differ from run to run (make test runs 32, 4 with kills; make soak 500 with -soak). A
// failure prints its seed and pipeline, and
//
//	go test ./runtime -run TestGeneratedPipelines -seed N [-soak] [-keep DIR]
//
// replays it; -keep leaves the pipeline, its inputs and the model's outputs in DIR, to run with
// flowrun run by hand (its sinks write Redis streams named in the pipeline).
func TestGeneratedPipelines(t *testing.T) {
	seeds := []uint64{*seedFlag}
	if *seedFlag == 0 {
		base := rand.Uint64() >> 16
		t.Logf("%d draws from seed %d", *drawsFlag, base)
		seeds = seeds[:0]
		for i := 0; i < *drawsFlag; i++ {
			seeds = append(seeds, base+uint64(i))
		}
	}
	kills := 0
	var drawn drawTally
	t.Cleanup(func() { t.Logf("draws: %s", drawn.String()) })
	for _, seed := range seeds {
		d := modeltest.New(seed)
		drawn.add(d)
		withKills := len(d.KillAt) > 0 && (*soakFlag || *seedFlag != 0 || kills < 4)
		if withKills {
			kills++
			drawn.count("process runs with kills", 1+boolInt(*soakFlag))
			drawn.count("SIGKILLs", len(d.KillAt)*(1+boolInt(*soakFlag)))
		}
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel() // most of a draw's time is spent waiting on Redis and on processes
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("replay with: go test ./runtime -run 'TestGeneratedPipelines' -seed %d", seed)
				}
			})
			// On the embedded Redis, which cannot wake blocked reads, reads wait as flowrun run's do there.
			// Small batches there take ten times as long with the race detector (make test) as without:
			// minutes for a long chain (batches of 3 through three hopping aggregates ran past 600 s),
			// past any deadline that still catches a hang, and so do many units polling at once (a
			// draw of 7 stages over 5 partitions each, about 40 units, took 40 s without the race
			// detector and ran past 600 s with it). make test runs those on the server only; make
			// soak, without the race detector, runs them everywhere.
			t.Run("embedded", func(t *testing.T) {
				if raceEnabled && d.BatchSize <= 3 {
					t.Skip("batches of 3 or fewer on the embedded Redis run without the race detector (make soak)")
				}
				runDrawInProcess(t, embeddedRedis.open(t), d, 20*time.Millisecond, embeddedRaceUnits)
			})
			t.Run("server", func(t *testing.T) { runDrawInProcess(t, server.open(t), d, 0, 0) })
			// Kills cost process starts: make test runs the first few draws that have them.
			if !withKills {
				return
			}
			for _, b := range processBackends {
				if b.name == "cluster" && !*soakFlag {
					continue
				}
				t.Run(b.name+"/processes", func(t *testing.T) { runDrawAsProcesses(t, b.urls(t), d) })
			}
		})
	}
}

// drawFiles writes a draw's inputs and pipeline to a directory of the test's and returns the
// pipeline file's path and what it names.
func drawFiles(t *testing.T, d *modeltest.Draw) (string, modeltest.Files) {
	t.Helper()
	dir := t.TempDir()
	if *keepFlag != "" {
		dir = filepath.Join(*keepFlag, strings.ReplaceAll(t.Name(), "/", "-"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for sink, want := range d.Expected() {
			var lines strings.Builder
			for _, m := range want {
				lines.WriteString(modeltest.Canonical(m) + "\n")
			}
			writeFile(t, filepath.Join(dir, "want-"+sink+".jsonl"), lines.String())
		}
	}
	prefix := fmt.Sprintf("drawn%d-%d", prefixes.Add(1), d.Seed)
	files := modeltest.Files{KeyPrefix: prefix, Stream: func(sink string) string { return prefix + ":" + sink }}
	for i := range d.Inputs {
		path := filepath.Join(dir, "input"+strconv.Itoa(i)+".jsonl")
		writeFile(t, path, d.Input(i))
		files.Inputs = append(files.Inputs, path)
	}
	path := filepath.Join(dir, "drawn.hcl")
	src := d.HCL(files)
	writeFile(t, path, src)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the drawn pipeline (%s):\n%s", path, src)
		}
	})
	return path, files
}

// runDrawInProcess runs a draw as a job in this process and compares its sinks with the model.
func runDrawInProcess(t *testing.T, c *redis.Client, d *modeltest.Draw, block time.Duration, raceUnits int) {
	path, files := drawFiles(t, d)
	plan, _, diags := flow.Build(path, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if units := unitsOf(plan); raceEnabled && raceUnits > 0 && units > raceUnits {
		t.Skipf("%d units (a stage on a partition each) on the embedded Redis run without the race detector (make soak)", units)
	}
	// Batches of 1 through seven hops on the embedded Redis take 20 s on an idle machine, and a
	// minute or two with make soak's parallel draws besides: the deadline only catches a job
	// that hangs.
	publishTables(t, c, plan, d)
	j := runJobWithin(t, c, plan, runtime.Options{BatchSize: d.BatchSize, NoFusion: d.NoFusion, Block: block}, 10*time.Minute)
	deadLetters := d.DeadLetters()
	for _, n := range j.summary.Nodes {
		counted := n.DeadLettered
		if asOfLookup(d, n.Name) {
			// Its dead letters are written as its timers fire, and its messages counted absorbed
			// when they came: its dead-letter stream has them.
			if counted != 0 {
				t.Errorf("%s: %d messages counted dead-lettered, want none: a lookup as_of absorbs them", n.Name, counted)
			}
			counted = totalLength(t, c, []string{redis.Keys{Prefix: files.KeyPrefix}.DeadLetter(n.Name)})
		}
		if n.Late != 0 || counted != int64(deadLetters[n.Name]) {
			t.Errorf("%s: %d late, %d dead-lettered, want none late and %d dead-lettered", n.Name, n.Late, counted, deadLetters[n.Name])
		}
	}
	// A process that stalls past its lease TTL (a loaded machine) loses partitions mid-batch, and
	// at-least-once may then deliver a message twice, as after a kill.
	lost := leaseLosses(j.log)
	if lost > 0 {
		t.Logf("%d leases lost on the way", lost)
	}
	checkDraw(t, c, d, files, lost > 0 && d.Pipeline.Delivery == "at_least_once")
	if t.Failed() {
		for _, n := range j.summary.Nodes {
			t.Logf("%-14s in %5d out %5d filtered %4d dropped %4d absorbed %5d dead-lettered %d late %d duplicates %d",
				n.Name, n.In, n.Out, n.Filtered, n.Dropped, n.Absorbed, n.DeadLettered, n.Late, n.Duplicates)
		}
	}
}

// runDrawAsProcesses runs a draw in flowrun processes, killing one at each of the draw's points,
// then runs it to its end as a job, and compares its sinks with the model.
func runDrawAsProcesses(t *testing.T, urls []string, d *modeltest.Draw) {
	c := openURLs(t, urls...)
	path, files := drawFiles(t, d)
	plan, _, diags := flow.Build(path, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	publishTables(t, c, plan, d)
	args := append([]string{"run", path, "--lease-ttl", "500ms", "--batch-size", strconv.Itoa(d.BatchSize)}, redisArgs(urls)...)
	if d.NoFusion {
		args = append(args, "--no-fusion")
	}
	bin := flowrunBinary(t)
	in := d.Pipeline.Sources[0].Output
	inputs := redis.Keys{Prefix: files.KeyPrefix}.Streams(in.Name, in.Partitions)
	written := func() int {
		n := 0
		for _, s := range inputs {
			l, err := c.Universal().XLen(context.Background(), s).Result()
			if err != nil {
				t.Fatal(err)
			}
			n += int(l)
		}
		return n
	}
	running := []*process{startBinary(t, bin, args...)}
	if d.Second {
		running = append(running, startBinary(t, bin, args...))
	}
	var logs []string
	for i, at := range d.KillAt {
		goal := int(at * float64(d.Lines()))
		waitFor(t, fmt.Sprintf("the sources to write %d of %d lines", goal, d.Lines()), func() bool { return written() >= goal })
		victim := running[i%len(running)]
		victim.kill(t)
		logs = append(logs, victim.log.String())
		running[i%len(running)] = startBinary(t, bin, args...)
	}
	for _, p := range running {
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	last := startBinary(t, bin, append(args, "--until-drained", "--log-format", "json")...)
	// A job that dead-lettered messages exits with status 3: a draw's lookup may, if the earlier
	// processes have not done it all.
	var exit *exec.ExitError
	if err := waitProcess(t, last); err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 3 && len(d.DeadLetters()) > 0) {
		t.Fatalf("the last process, run as a job to its end: %v\n%s", err, last.log.String())
	}
	for _, n := range jobSummary(t, last.log.String()) {
		if n.Late != 0 {
			t.Errorf("%s: %d late, want none", n.Name, n.Late)
		}
	}
	checkDraw(t, c, d, files, d.Pipeline.Delivery == "at_least_once")
	if t.Failed() {
		t.Logf("the processes' logs:\n%s", strings.Join(append(logs, last.log.String()), "\n----\n"))
	}
}

// publishTables writes the updates of a draw's tables to their topics, which nothing else writes,
// before the pipeline starts: every lookup then sees the whole table (modeltest.Table).
func publishTables(t *testing.T, c *redis.Client, plan *flow.Plan, d *modeltest.Draw) {
	t.Helper()
	if len(d.Pipeline.Tables) == 0 {
		return
	}
	ctx := context.Background()
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range d.Pipeline.Tables {
		for _, u := range tb.Updates {
			payload := []byte("null")
			if u.Row != nil {
				if payload, err = json.Marshal(u.Row); err != nil {
					t.Fatal(err)
				}
			}
			if err := pub.Publish(ctx, tb.Input.Name, stages.NewMessage(u.Key, payload, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkDraw compares what each sink of a draw wrote with the model. mayRepeat: at-least-once
// through kills, where a message may arrive twice (and count twice): only what is lost counts.
func checkDraw(t *testing.T, c *redis.Client, d *modeltest.Draw, files modeltest.Files, mayRepeat bool) {
	t.Helper()
	for sink, want := range d.Expected() {
		var got []modeltest.Message
		for _, m := range streamPayloads(t, c, files.Stream(sink)) {
			got = append(got, modeltest.Message(m))
		}
		diff := modeltest.Diff(got, want, 12)
		if mayRepeat {
			diff = modeltest.DiffLost(got, want, 12)
		}
		if len(diff) > 0 {
			t.Errorf("sink %s received %d messages, the model %d:\n%s", sink, len(got), len(want), strings.Join(diff, "\n"))
		}
	}
	if d.Pipeline.OffloadOver != "" {
		checkOffloaded(t, c, files.KeyPrefix)
	}
	if t.Failed() {
		logFlows(t, c, d, files)
	}
}

// checkOffloaded checks, after a run that offloaded payloads (through kills, maybe), every stream
// under prefix that has offloaded payloads: each reference names a payload key that exists, and
// each payload key belongs to an entry (checkPayloadRefs). A reference to a key that never existed
// would also have lost its message, which the comparison with the model finds.
func checkOffloaded(t *testing.T, c *redis.Client, prefix string) {
	t.Helper()
	all, err := c.KeysUnder(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var streams []string
	for _, k := range all {
		stream, _, found := strings.Cut(k, ":payload:")
		if !found {
			stream, found = strings.CutSuffix(k, ":payloads")
		}
		if found && !seen[stream] {
			seen[stream] = true
			streams = append(streams, stream)
		}
	}
	checkPayloadRefs(t, c, prefix, streams)
}

// logFlows logs how many entries each topic of a draw's run holds beside what the model sends
// through it, to tell where the run first went another way.
func logFlows(t *testing.T, c *redis.Client, d *modeltest.Draw, files modeltest.Files) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "flows.hcl")
	writeFile(t, path, d.HCL(files))
	plan, _, diags := flow.Build(path, flow.Options{})
	if diags.HasErrors() {
		return
	}
	flows := d.Flows()
	keys := redis.Keys{Prefix: files.KeyPrefix}
	var lines []string
	for _, topic := range plan.Topics {
		n := int64(0)
		for _, s := range keys.Streams(topic.Name, topic.Partitions) {
			l, err := c.Universal().XLen(context.Background(), s).Result()
			if err != nil {
				return
			}
			n += l
		}
		want, known := flows[topic.Name]
		switch {
		case topic.Repartition != nil:
			want, known = flows[strings.TrimSuffix(topic.Name, ".by_key")+"<"]
		case topic.Implicit:
			want, known = flows[topic.Stage+">"]
		}
		line := fmt.Sprintf("topic %s (%d partitions): %d entries", topic.Name, topic.Partitions, n)
		if known {
			line += fmt.Sprintf(", the model sends %d", want)
		}
		lines = append(lines, line)
	}
	t.Logf("the flows:\n%s", strings.Join(lines, "\n"))
}

// drawTally counts what the draws covered, for the log (make soak's figures in BENCHMARKS.md).
type drawTally struct {
	mu     sync.Mutex
	counts map[string]int
	order  []string
}

func (t *drawTally) count(what string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = map[string]int{}
	}
	if _, ok := t.counts[what]; !ok {
		t.order = append(t.order, what)
	}
	t.counts[what] += n
}

// add counts a draw's shape.
func (t *drawTally) add(d *modeltest.Draw) {
	t.count("pipelines", 1)
	t.count("messages", d.Lines())
	for _, s := range d.Pipeline.Stages {
		what := s.Kind
		if s.Kind == "aggregate" {
			what = s.Window.Type + " " + what
			if s.EventTime == nil || strings.HasPrefix(s.EventTime.HCL, "msg.window") {
				what += " of results"
			}
		}
		t.count(what, 1)
	}
	t.count("declared topics", len(d.Pipeline.Topics))
	for _, tb := range d.Pipeline.Tables {
		t.count("tables", 1)
		t.count("table updates", len(tb.Updates))
	}
	t.count(d.Pipeline.Delivery, 1)
	if d.Pipeline.OffloadOver != "" {
		t.count("offloading", 1)
	}
	if d.NoFusion {
		t.count("unfused", 1)
	}
	if len(d.Inputs) > 1 {
		t.count("two sources", 1)
	}
}

func (t *drawTally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts := make([]string, len(t.order))
	for i, what := range t.order {
		parts[i] = fmt.Sprintf("%d %s", t.counts[what], what)
	}
	return strings.Join(parts, ", ")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// embeddedRaceUnits is the most units a draw may have to run on the embedded Redis under the race
// detector: about one draw in ten has more (the median has 16).
const embeddedRaceUnits = 32

// unitsOf counts a plan's units: a stage on one of its input's partitions each.
func unitsOf(plan *flow.Plan) int {
	n := 0
	for _, s := range plan.Stages {
		if s.Input != nil {
			n += s.Input.Partitions
		}
	}
	return n
}

// asOfLookup reports whether the draw's stage of that name is a lookup as_of.
func asOfLookup(d *modeltest.Draw, name string) bool {
	for _, s := range d.Pipeline.Stages {
		if s.Name == name {
			return s.Kind == "lookup" && s.AsOf != nil
		}
	}
	return false
}
