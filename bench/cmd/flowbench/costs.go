package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// The cost table (-costs, which make bench passes): how flowrun's throughput and peak memory grow
// with the partitions of its topics, the length of a chain of stages (separated by declared topics,
// or chained with input = stage.X, which stage fusion runs in one hop), the payload's size and the
// number of distinct keys; and what a waiting message costs Redis. Each cell varies one of these
// from the base (4 partitions, 1 stage, 200-byte payloads, 10k keys) and is one short flowrun run:
// a warm-up, then the process stopped while the cell's messages are published into the input topic
// (by key, into the partition flowrun's own hash gives), then continued; msg/s is the number of
// messages in the output topic over the time since it continued, when all are through or the cell's
// time is up.

var (
	costsFlag      = flag.Bool("costs", false, "after the rounds, measure the cost table: flowrun's throughput and peak RSS against partitions, chain length, payload size and distinct keys, and Redis memory per waiting message")
	costPartitions = flag.Int("cost-partitions", 0, "experiment: the partitions of the cost table's base (default 4)")
)

const costPrefix = "fc" // the key_prefix of the cost pipelines

// costCell is one run of the cost table.
type costCell struct {
	dim, value string // what it varies, and to what
	partitions int
	stages     int
	fused      bool // stages chained with input = stage.X, not through declared topics
	payload    int  // bytes
	keys       int  // distinct keys the messages are spread over
	n          int  // messages of the measured phase (0: the base count)
	limit      time.Duration
}

func (c costCell) name() string { return "cost " + c.dim + " " + c.value }

// costBase is the cell every row varies one thing of.
var costBase = costCell{partitions: 4, stages: 1, payload: 200, keys: 10_000}

// costCells returns the cells in the order of the table; base is the number of messages of a
// cell of 200-byte payloads, and limit the longest a cell's measured phase may take.
func costCells(base int, limit time.Duration) []costCell {
	var cells []costCell
	add := func(dim, value string, f func(*costCell)) {
		c := costBase
		c.dim, c.value, c.n, c.limit = dim, value, base, limit
		f(&c)
		cells = append(cells, c)
	}
	for _, p := range []int{1, 4, 16, 64} {
		add("partitions", strconv.Itoa(p), func(c *costCell) { c.partitions = p })
	}
	// A chain of k stages does k times the work per message: a k-th of the messages, so that its
	// cell is as short.
	for _, s := range []int{1, 3, 10} {
		add("stages", strconv.Itoa(s)+" unfused", func(c *costCell) { c.stages, c.n = s, max(base/s, 100) })
	}
	for _, s := range []int{3, 10} {
		add("stages", strconv.Itoa(s)+" fused", func(c *costCell) { c.stages, c.fused, c.n = s, true, max(base/s, 100) })
	}
	for _, p := range []struct {
		size  int
		label string
	}{{200, "200 B"}, {4 << 10, "4 KB"}, {64 << 10, "64 KB"}} {
		add("payload", p.label, func(c *costCell) {
			c.payload = p.size
			// Five times the bytes of the base cell, at least 2000 messages.
			c.n = max(min(base, base*1000/p.size), min(base, 2000))
		})
	}
	for _, k := range []struct {
		n     int
		label string
	}{{10, "10"}, {10_000, "10k"}, {1_000_000, "1M"}} {
		add("keys", k.label, func(c *costCell) {
			c.keys = k.n
			if k.n > base && base >= 100_000 {
				// Enough messages for every key to be seen once, and the time for them.
				c.n, c.limit = k.n, 3*limit
			}
		})
	}
	return cells
}

// same reports whether two cells run the same flow, so that the table measures it once.
func (c costCell) same(d costCell) bool {
	return c.partitions == d.partitions && c.stages == d.stages && (c.fused == d.fused || c.stages == 1) &&
		c.payload == d.payload && c.keys == d.keys && c.n == d.n
}

// hcl is the cell's pipeline: topic in, the chain of filters that pass every message (each
// decodes it), topic out; unfused with a declared topic between each two stages, fused chained with
// stage.X. Every stage has FW-k's retry policy and dead-letter topic.
func (c costCell) hcl() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by flowbench: a cell of the cost table (%s).\npipeline \"cost\" {\n  key_prefix = %q\n}\n\n", c.name(), costPrefix)
	b.WriteString(benchRetryHCL)
	topics := []string{"in", "out"}
	if !c.fused {
		for i := 1; i < c.stages; i++ {
			topics = append(topics, fmt.Sprintf("t%d", i))
		}
	}
	for _, t := range topics {
		fmt.Fprintf(&b, "topic %q {\n  partitions = %d\n}\n\n", t, c.partitions)
	}
	b.WriteString("topic \"failed\" {\n  partitions = 1\n}\n\n")
	for i := 1; i <= c.stages; i++ {
		in, out := "topic.in", ""
		switch {
		case i > 1 && c.fused:
			in = fmt.Sprintf("stage.s%d", i-1)
		case i > 1:
			in = fmt.Sprintf("topic.t%d", i-1)
		}
		switch {
		case i == c.stages:
			out = "topic.out"
		case !c.fused:
			out = fmt.Sprintf("topic.t%d", i)
		}
		b.WriteString(strings.Replace(filterStageHCL(fmt.Sprintf("s%d", i), in, out), filterWhere, "msg.amount >= 0", 1))
	}
	return b.String()
}

// costStream is the stream of a partition of a cost pipeline's topic.
func costStream(topic string, p int) string {
	return costPrefix + ":{" + topic + ":" + strconv.Itoa(p) + "}"
}

// costKey is message i's key: over each run of keys consecutive messages, every key once.
func costKey(i, keys int) string {
	return "k" + strconv.Itoa(int(uint64(i)*2654435761%uint64(keys)))
}

// costPayload is message i's JSON payload of exactly size bytes (at least 64).
func costPayload(buf []byte, i, size int, key string) []byte {
	buf = fmt.Appendf(buf[:0], `{"seq":%d,"key":%q,"amount":%d,"pad":"`, i, key, 1000+i%9000)
	for len(buf) < size-2 {
		buf = append(buf, 'x')
	}
	return append(buf, '"', '}')
}

// publishCost writes messages first..first+n-1 of a cell into its input topic, each into the
// partition of its key, in pipelines of about a megabyte, from 4 goroutines.
func publishCost(ctx context.Context, rdb *goredis.Client, c costCell, first, n int) error {
	batch := max(1, min(pubBatch, (1<<20)/c.payload))
	return inParallel(n, 4, func(from, count int) error {
		pipe := rdb.Pipeline()
		var buf []byte
		for done := 0; done < count; {
			k := min(batch, count-done)
			for j := range k {
				i := first + from + done + j
				key := costKey(i, c.keys)
				buf = costPayload(buf, i, c.payload, key)
				pipe.XAdd(ctx, &goredis.XAddArgs{Stream: costStream("in", redis.Partition(key, c.partitions)),
					Values: []any{fieldPayload, string(buf), "key", key}})
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("publishing: %w", err)
			}
			done += k
		}
		return nil
	})
}

// outLen is how many messages the output topic of a cell holds.
func outLen(ctx context.Context, rdb *goredis.Client, partitions int) (int, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*goredis.IntCmd, partitions)
	for p := range partitions {
		cmds[p] = pipe.XLen(ctx, costStream("out", p))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	total := 0
	for _, c := range cmds {
		total += int(c.Val())
	}
	return total, nil
}

// waitOut polls the output topic until it holds want messages or the deadline passes, and returns
// how many it holds and when it was last seen to grow.
func waitOut(ctx context.Context, rdb *goredis.Client, partitions, want int, deadline time.Time) (int, time.Time, error) {
	got, last := 0, time.Now()
	for got < want && time.Now().Before(deadline) {
		n, err := outLen(ctx, rdb, partitions)
		if err != nil {
			return got, last, err
		}
		if n > got {
			got, last = n, time.Now()
		}
		time.Sleep(2 * time.Millisecond)
	}
	return got, last, nil
}

// costResult is a cell's figures.
type costResult struct {
	cell    costCell
	failed  string
	rate    float64 // messages per second
	cpu     float64 // ns of flowrun's CPU per message per stage
	peakKB  int64
	got     int
	capped  bool
	elapsed time.Duration
	sameAs  string  // measured once, in this row's cell
	peaksKB []int64 // the peak RSS of each run of a repeated cell (runCostRepeated), ascending
}

// runCost runs one cell.
func (h *harness) runCost(ctx context.Context, c costCell) (res costResult) {
	res.cell = c
	fail := func(format string, args ...any) costResult {
		res.failed = fmt.Sprintf(format, args...)
		return res
	}
	if err := h.rdb.FlushAll(ctx).Err(); err != nil {
		return fail("FLUSHALL: %v", err)
	}
	name := strings.NewReplacer(" ", "-").Replace(c.name())
	path := filepath.Join(h.tmp, name+".hcl")
	if err := os.WriteFile(path, []byte(c.hcl()), 0o644); err != nil {
		return fail("%v", err)
	}
	h.pipelines[name] = path
	sc := scenario{name: c.name(), kind: kindHops, impl: implFlowrun, stages: c.stages, pipeline: name}
	ch, _, err := h.startSystem(sc, nil)
	if err != nil {
		return fail("%v", err)
	}
	defer func() {
		if err := ch.stop(30 * time.Second); err != nil && res.failed == "" {
			res.failed = "stopping: " + err.Error()
		}
	}()
	failed := func(phase string, err error) costResult {
		if ch.exited() {
			return fail("%s: the process exited: %s", phase, ch.logTail())
		}
		return fail("%s: %v", phase, err)
	}

	warm := min(1000, max(c.n/10, 10))
	if err := publishCost(ctx, h.rdb, c, 0, warm); err != nil {
		return failed("warm-up", err)
	}
	if got, _, err := waitOut(ctx, h.rdb, c.partitions, warm, time.Now().Add(60*time.Second)); err != nil || got < warm {
		return failed("warm-up", fmt.Errorf("%d of %d messages through within 60s (%v)", got, warm, err))
	}
	if err := ch.pause(); err != nil {
		return failed("measure", err)
	}
	if err := publishCost(ctx, h.rdb, c, warm, c.n); err != nil {
		return failed("measure", err)
	}
	cpu0, err := ch.cpu()
	if err != nil {
		return failed("measure", err)
	}
	t0 := time.Now()
	if err := ch.signal(syscall.SIGCONT); err != nil {
		return failed("measure", err)
	}
	got, last, err := waitOut(ctx, h.rdb, c.partitions, warm+c.n, t0.Add(c.limit))
	end := time.Now()
	cpu1, cerr := ch.cpu()
	if err == nil {
		err = cerr
	}
	if err != nil {
		return failed("measure", err)
	}
	res.got = got - warm
	if res.got <= 0 {
		return failed("measure", fmt.Errorf("nothing arrived within %s", c.limit))
	}
	res.elapsed = last.Sub(t0)
	if res.got < c.n {
		res.elapsed, res.capped = end.Sub(t0), true
	}
	res.rate = float64(res.got) / res.elapsed.Seconds()
	res.cpu = float64(cpu1-cpu0) / float64(res.got*c.stages)
	_, res.peakKB, _ = ch.memKB()
	return res
}

// runCostRepeated runs a cell once, or, for a row of the partitions, once per round (-rounds) and
// keeps the run of the median peak RSS: a peak depends on when the collector runs, and varies by
// tens of megabytes from one run to the next on a busy machine.
func (h *harness) runCostRepeated(ctx context.Context, c costCell) costResult {
	runs := 1
	if c.dim == "partitions" {
		runs = max(1, h.cfg.rounds)
	}
	var results []costResult
	for range runs {
		r := h.runCost(ctx, c)
		if r.failed != "" || ctx.Err() != nil {
			return r
		}
		results = append(results, r)
	}
	sort.Slice(results, func(i, j int) bool { return results[i].peakKB < results[j].peakKB })
	r := results[len(results)/2]
	for _, o := range results {
		r.peaksKB = append(r.peaksKB, o.peakKB)
	}
	return r
}

// perPartition is what a partition beyond the first adds to flowrun's peak RSS: the rows of 16 and
// 64 partitions against the row of 1 (issue 26 aims at 2 MB at most), "" without those rows.
func (t costTable) perPartition() string {
	peaks := map[int]int64{}
	for _, r := range t.rows {
		if r.cell.dim == "partitions" && r.failed == "" {
			peaks[r.cell.partitions] = r.peakKB
		}
	}
	one, ok := peaks[1]
	if !ok {
		return ""
	}
	var parts []string
	met := true
	for _, p := range []int{16, 64} {
		peak, ok := peaks[p]
		if !ok {
			continue
		}
		per := float64(peak-one) / 1024 / float64(p-1)
		met = met && per <= 2
		parts = append(parts, fmt.Sprintf("%.2f MB at %d partitions", per, p))
	}
	if len(parts) == 0 {
		return ""
	}
	verdict := "met"
	switch {
	case t.quick:
		verdict = "not judged in quick mode"
	case !met:
		verdict = "NOT met"
	}
	return fmt.Sprintf("peak RSS per partition beyond the first (aim <= 2 MB, issue 26): %s; %s", strings.Join(parts, ", "), verdict)
}

// backlogMemory fills a 1-partition topic that nothing reads with n messages of 200 bytes (and a
// key, as flowrun writes them) and returns Redis's used_memory growth per message.
func (h *harness) backlogMemory(ctx context.Context, n int) (float64, error) {
	if err := h.rdb.FlushAll(ctx).Err(); err != nil {
		return 0, err
	}
	used := func() (int64, error) {
		info, err := h.rdb.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(infoField(info, "used_memory"), 10, 64)
	}
	before, err := used()
	if err != nil {
		return 0, err
	}
	c := costBase
	c.partitions = 1
	if err := publishCost(ctx, h.rdb, c, 0, n); err != nil {
		return 0, err
	}
	after, err := used()
	if err != nil {
		return 0, err
	}
	err = h.rdb.FlushAll(ctx).Err()
	return float64(after-before) / float64(n), err
}

// costTable is what -costs measured.
type costTable struct {
	rows         []costResult
	backlogN     int
	backlogBytes float64 // per waiting message
	backlogErr   string
	quick        bool // -quick: the figures mean nothing, and are not judged
}

// runCosts measures the cells that the -only filter picks (by "cost <dimension> <value>"), and
// Redis's memory per waiting message ("cost backlog memory").
func (h *harness) runCosts(ctx context.Context, filter *regexp.Regexp) (t costTable, failed int) {
	base, limit := h.cfg.flat, 6*time.Second
	if *costPartitions > 0 {
		costBase.partitions = *costPartitions
		fmt.Printf("EXPERIMENT: the cost table's base has %d partitions\n", *costPartitions)
	}
	var done []costResult
	for _, c := range costCells(base, limit) {
		if filter != nil && !filter.MatchString(c.name()) || ctx.Err() != nil {
			continue
		}
		var r costResult
		for _, d := range done {
			if d.failed == "" && d.cell.same(c) {
				r = d
				r.cell, r.sameAs = c, d.cell.name()
				break
			}
		}
		if r.sameAs == "" {
			r = h.runCostRepeated(ctx, c)
			if r.failed != "" {
				failed++
			}
			done = append(done, r)
			fmt.Printf("cost     %s\n", costLine(r))
		}
		t.rows = append(t.rows, r)
	}
	t.quick = h.cfg.quick
	if line := t.perPartition(); line != "" {
		fmt.Printf("cost     %s\n", line)
	}
	const name = "cost backlog memory"
	if (filter == nil || filter.MatchString(name)) && ctx.Err() == nil {
		t.backlogN = base
		var err error
		if t.backlogBytes, err = h.backlogMemory(ctx, base); err != nil {
			t.backlogErr = err.Error()
			failed++
		}
		fmt.Printf("cost     backlog memory: %.0f bytes of Redis memory per waiting message of 200 bytes (%d messages)\n", t.backlogBytes, base)
	}
	return t, failed
}

func costLine(r costResult) string {
	s := fmt.Sprintf("%-28s ", r.cell.name())
	if r.failed != "" {
		return s + "FAILED: " + r.failed
	}
	s += fmt.Sprintf("%9.0f msg/s  %6.1f MB/s  cpu %.2f us/msg/stage  peak RSS %s", r.rate, r.rate*float64(r.cell.payload)/1e6, r.cpu/1000, mb(r.peakKB))
	if r.capped {
		s += fmt.Sprintf("  (time limit: %d of %d through)", r.got, r.cell.n)
	}
	return s
}

// report renders the cost table in Markdown.
func (t costTable) report() string {
	if len(t.rows) == 0 && t.backlogN == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nCost table (-costs): one short run per cell, each varying one thing of the base: 4 partitions, 1 stage, 200-byte payloads, 10k keys; filter stages that decode every message\n\n")
	b.WriteString("| varies | value | msg/s | MB/s | CPU us/msg/stage | peak RSS MB | notes |\n| --- | --- | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range t.rows {
		c := r.cell
		if r.failed != "" {
			fmt.Fprintf(&b, "| %s | %s | | | | | FAILED: %s |\n", c.dim, c.value, mdEscape(r.failed))
			continue
		}
		var notes []string
		if r.sameAs != "" {
			notes = append(notes, "the run of "+strings.TrimPrefix(r.sameAs, "cost "))
		}
		notes = append(notes, fmt.Sprintf("%d messages", c.n))
		if c.dim == "keys" {
			notes = append(notes, fmt.Sprintf("%d distinct keys", min(c.keys, r.got)))
		}
		if c.fused {
			notes = append(notes, "chained with stage.X")
		}
		if r.capped {
			notes = append(notes, fmt.Sprintf("time limit: %d through", r.got))
		}
		if len(r.peaksKB) > 1 && r.sameAs == "" {
			var peaks []string
			for _, kb := range r.peaksKB {
				peaks = append(peaks, fmt.Sprintf("%.0f", float64(kb)/1024))
			}
			notes = append(notes, fmt.Sprintf("the run of the median peak RSS of %d (%s MB)", len(r.peaksKB), strings.Join(peaks, ", ")))
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f | %.2f | %.0f | %s |\n", c.dim, c.value, r.rate, r.rate*float64(c.payload)/1e6, r.cpu/1000,
			float64(r.peakKB)/1024, strings.Join(notes, "; "))
	}
	if line := t.perPartition(); line != "" {
		fmt.Fprintf(&b, "\nThe partitions rows, %s\n", line)
	}
	if t.backlogN > 0 {
		if t.backlogErr != "" {
			fmt.Fprintf(&b, "\nRedis memory per waiting message: FAILED: %s\n", mdEscape(t.backlogErr))
		} else {
			fmt.Fprintf(&b, "\nRedis memory per waiting message: %.0f bytes (%d messages of 200 bytes and a key in one partition that nothing reads; INFO used_memory after less before, per message)\n",
				t.backlogBytes, t.backlogN)
		}
	}
	return b.String()
}
