package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flowrun/flowrun/internal/nexmark"
)

// The Nexmark queries of bench/nexmark, each run as a whole job (`flowrun run --until-drained`) on
// the same generated events (internal/nexmark), timed from exec to exit, with the CPU of the flowrun
// process and of redis-server. The msg/s column is events per second of wall time; the report adds
// events per second per core, counting flowrun's and Redis's CPU and then flowrun's alone, beside
// Flink 1.13's published throughput per core (the nexmark/nexmark project's README: 8 workers of 8
// cores, 100 million events generated in process, no broker). An event is one the query reads:
// the bids for queries 0 to 2, 5, 7, 11 and 12, the people and auctions for 3 and 8. 200,000 events
// (config.nexmark) are about 184,000 bids, 12,000 auctions and 4,000 people.

const kindNexmark kind = 300

// flinkPerCore is Flink 1.13's published throughput per core, events per second, by query.
var flinkPerCore = map[string]float64{
	"q0": 155_020, "q1": 157_940, "q2": 175_210, "q3": 152_120, "q5": 22_140, "q7": 12_330,
	"q8": 146_140, "q11": 39_700, "q12": 75_670,
}

var nexmarkQueries = []string{"q0", "q1", "q2", "q3", "q5", "q7", "q8", "q11", "q12"}

func init() {
	for _, q := range nexmarkQueries {
		scenarios = append(scenarios, scenario{name: "NEXMARK " + q, kind: kindNexmark, impl: implFlowrun, stages: 1, pipeline: q})
	}
}

// nexmarkFiles writes the generated events as JSON lines once per run of the harness, and returns
// the flowrun variables that name each query's files, and how many events each query reads.
func (h *harness) nexmarkFiles() (map[string][]string, map[string]int, error) {
	dir := filepath.Join(h.tmp, "nexmark")
	ev := nexmark.Generate(nexmark.Config{Seed: 1, Events: h.cfg.nexmark, Start: 1_767_225_600_000, Delay: 1})
	files := map[string][]map[string]any{"bids": ev.Bids, "persons": ev.Persons, "auctions": ev.Auctions}
	vars := map[string][]string{}
	for name, events := range files {
		path := filepath.Join(dir, name+".jsonl")
		vars[name] = []string{"--var", name + "=" + path}
		if _, err := os.Stat(path); err == nil {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, err
		}
		if err := writeJSONLines(path, events); err != nil {
			return nil, nil, err
		}
	}
	queryVars, reads := map[string][]string{}, map[string]int{}
	for _, q := range nexmarkQueries {
		queryVars[q], reads[q] = vars["bids"], len(ev.Bids)
	}
	for _, q := range []string{"q3", "q8"} {
		queryVars[q], reads[q] = append(slices.Clone(vars["persons"]), vars["auctions"]...), len(ev.Persons)+len(ev.Auctions)
	}
	return queryVars, reads, nil
}

func writeJSONLines(path string, events []map[string]any) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			_ = f.Close() // the write failed already
			return err
		}
	}
	if err := w.Flush(); err != nil {
		_ = f.Close() // the write failed already
		return err
	}
	return f.Close()
}

// runNexmark runs one query as a job and measures it.
func (h *harness) runNexmark(_ context.Context, sc scenario) result {
	vars, reads, err := h.nexmarkFiles()
	if err != nil {
		return result{failed: err.Error()}
	}
	pipeline, err := filepath.Abs(filepath.Join(h.repoRoot(), "bench", "nexmark", sc.pipeline+".hcl"))
	if err != nil {
		return result{failed: err.Error()}
	}
	out := filepath.Join(h.tmp, "nexmark", sc.pipeline+".out.jsonl")
	_ = os.Remove(out)
	rcpu0, err := h.srv.cpu()
	if err != nil {
		return result{failed: err.Error()}
	}
	bin, env := h.flowrunJob(sc)
	args := append([]string{"run", "--until-drained", pipeline, "--redis", h.srv.url(), "--var", "output=" + out}, vars[sc.pipeline]...)
	if sc.impl == implRaw {
		out += ".raw"
		bin, args = h.self, []string{"child", "raw-q0", "-addr", h.srv.addr(), "-in", filepath.Join(h.tmp, "nexmark", "bids.jsonl"), "-out", out}
	}
	t0 := time.Now()
	c, err := startChild(sc.name, h.logPath(sc), env, bin, args...)
	if err != nil {
		return result{failed: err.Error()}
	}
	if err := c.wait(10 * time.Minute); err != nil {
		return result{failed: err.Error() + "; " + c.logTail()}
	}
	wall := time.Since(t0)
	rcpu1, err := h.srv.cpu()
	if err != nil {
		return result{failed: err.Error()}
	}
	n := reads[sc.pipeline]
	res := result{got: n, elapsed: wall, rate: float64(n) / wall.Seconds(), peakKB: c.maxRSSKB()}
	if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.cpu = float64(ru.Utime.Nano()+ru.Stime.Nano()) / float64(n)
	}
	res.redisCPU = float64(rcpu1-rcpu0) / float64(n)
	if rows, err := countLines(out); err == nil {
		res.note("%d rows", rows)
	}
	return res
}

// repoRoot is the repository whose bench/nexmark the queries come from: the working directory
// when it is one (make bench runs there, and a flowrun binary built elsewhere, such as an older
// commit's to compare with, then runs today's queries), else the flowrun binary's (bin/flowrun)
// parent.
func (h *harness) repoRoot() string {
	if _, err := os.Stat(filepath.Join("bench", "nexmark")); err == nil {
		return "."
	}
	return filepath.Dir(filepath.Dir(h.flowrun))
}

func countLines(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strings.Count(string(b), "\n"), nil
}

// nexmarkReport is the per-core table of the queries, beside Flink's.
func nexmarkReport(sums map[string]summary) string {
	var b strings.Builder
	for _, q := range nexmarkQueries {
		for _, name := range []string{"NEXMARK " + q, "NEXMARK " + q + " raw"} {
			s, ok := sums[name]
			if !ok || s.ok == 0 || s.cpu <= 0 {
				continue
			}
			if b.Len() == 0 {
				b.WriteString("\nNexmark (bench/nexmark, events per second per core; Flink 1.13's from the nexmark/nexmark README; " +
					"q0 raw is query 0 with go-redis alone, nexmark_raw.go)\n\n")
				b.WriteString("| query | events/s | per core, process + Redis | per core, process alone | Flink 1.13 per core | process + Redis / Flink |\n")
				b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: |\n")
			}
			both, alone := 1e9/(s.cpu+s.redisCPU), 1e9/s.cpu
			fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %.0f | %.2f |\n", strings.TrimPrefix(name, "NEXMARK "), s.rate, both, alone, flinkPerCore[q], both/flinkPerCore[q])
		}
	}
	return b.String()
}
