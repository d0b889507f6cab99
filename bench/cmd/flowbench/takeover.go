package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The TAKEOVER scenario (issue 26): three flowrun processes share a pipeline of 37 units (two map
// stages and a sink, over topics of 12, 12 and 13 partitions) on a private Redis Cluster of three
// masters, while the harness publishes messages at a steady rate. The harness SIGKILLs the process
// that holds the most units and measures from outside how long it takes until a survivor holds the
// lease of every unit the dead one held, reading the lease keys every few milliseconds; beside it,
// `flowrun inspect --json` runs in a loop as an operator's would, and its first report that shows
// them all owned is timed too. Then a new process takes the dead one's place, the three share the
// units again, and the next kill follows. A dead process's leases last up to one TTL after its
// last renewal; the budget is that its units are owned again within 1.5 TTLs.

const kindTakeover kind = 700

func init() {
	scenarios = append(scenarios, scenario{name: "TAKEOVER", kind: kindTakeover, impl: implFlowrun})
}

var (
	takeoverTTLFlag   = flag.Duration("takeover-ttl", 0, "the lease TTL of the TAKEOVER scenario (default 3s, or 1s with -quick)")
	takeoverKillsFlag = flag.Int("takeover-kills", 0, "processes the TAKEOVER scenario kills per round (default 4, or 2 with -quick)")
	takeoverRateFlag  = flag.Float64("takeover-rate", 0, "messages per second the TAKEOVER scenario publishes (default 3000, or 1000 with -quick)")
	takeoverBusyFlag  = flag.Int("takeover-busy", 0, "goroutines spinning in a child process during the TAKEOVER scenario, to make the machine busier")
	takeoverDebugFlag = flag.Bool("takeover-debug", false, "run the TAKEOVER scenario's processes with --log-level debug (with -keep: their logs show each lease taken)")
)

// takeoverSettings are the scenario's TTL, kills per round and publishing rate: the run's
// configuration's, or the flags'.
func (h *harness) takeoverSettings() (ttl time.Duration, kills int, rate float64) {
	ttl, kills, rate = h.cfg.takeoverTTL, h.cfg.takeoverKills, h.cfg.takeoverRate
	if *takeoverTTLFlag > 0 {
		ttl = *takeoverTTLFlag
	}
	if *takeoverKillsFlag > 0 {
		kills = *takeoverKillsFlag
	}
	if *takeoverRateFlag > 0 {
		rate = *takeoverRateFlag
	}
	return ttl, kills, rate
}

const takeoverPrefix = "tk"

// takeoverProcs is how many processes share the pipeline.
const takeoverProcs = 3

// takeoverTopics are the pipeline's topics; each is read by the reader of the same index.
var takeoverTopics = []struct {
	name       string
	partitions int
}{{"in", 12}, {"mid", 12}, {"out", 13}}

var takeoverReaders = []string{"a", "b", "c"}

// takeoverHCL is the pipeline: in -> a -> mid -> b -> out -> c (a capped stream), every topic keyed
// by the message's key and trimmed, so that a long run holds Redis's memory steady.
func takeoverHCL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by flowbench: the TAKEOVER scenario's pipeline.\npipeline \"takeover\" {\n  key_prefix = %q\n}\n\n", takeoverPrefix)
	for _, t := range takeoverTopics {
		fmt.Fprintf(&b, "topic %q {\n  partitions = %d\n  key        = msg.key\n  retention {\n    max_len = 20000\n  }\n}\n\n", t.name, t.partitions)
	}
	b.WriteString("stage \"a\" {\n  kind   = \"map\"\n  input  = topic.in\n  output = topic.mid\n  set    = { hop = 1 }\n}\n\n")
	b.WriteString("stage \"b\" {\n  kind   = \"map\"\n  input  = topic.mid\n  output = topic.out\n  set    = { hop = 2 }\n}\n\n")
	fmt.Fprintf(&b, "sink \"c\" {\n  kind    = \"redis_stream\"\n  input   = topic.out\n  stream  = \"%s:{delivered}\"\n  max_len = 20000\n}\n", takeoverPrefix)
	return b.String()
}

// takeoverUnits returns the lease key of every unit, in topic and partition order.
func takeoverUnits() []string {
	keys := redis.Keys{Prefix: takeoverPrefix}
	var out []string
	for i, t := range takeoverTopics {
		for p := range t.partitions {
			out = append(out, keys.Lease(t.name, p, takeoverReaders[i]))
		}
	}
	return out
}

// takeoverKill is what one kill measured.
type takeoverKill struct {
	units   int           // the units the killed process held
	lapsed  time.Duration // from the kill until none of them was held by it any more
	owned   time.Duration // until a survivor held every one of them
	inspect time.Duration // until a flowrun inspect that ended then reported them all owned; 0: none did
	inspRun time.Duration // how long the last of those inspect runs took
}

// takeoverResult is a run's kills, with the TTL they are measured in.
type takeoverResult struct {
	ttl   time.Duration
	kills []takeoverKill
}

// privateCluster starts the harness's Redis Cluster of three masters at first use, with the tests'
// own helper (see privatePG for harnessTB).
func (h *harness) privateCluster() (cl *redistest.Cluster, err error) {
	if h.cluster != nil {
		return h.cluster, nil
	}
	tb := &harnessTB{}
	h.cleanups = append(h.cleanups, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	})
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(tbFailure)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("a Redis Cluster of 3 masters: %s", string(f))
		}
	}()
	h.cluster = redistest.StartCluster(tb, 3)
	return h.cluster, nil
}

// takeoverProc is one of the flowrun processes.
type takeoverProc struct {
	c   *child
	tag string // "-<pid>-", which its process ID (the leases' owner) contains
}

func (p *takeoverProc) owns(owner string) bool { return strings.Contains(owner, p.tag) }

// runTakeover runs the scenario once: the processes, the publisher, and the kills.
func (h *harness) runTakeover(ctx context.Context, sc scenario) (res result) {
	ttl, kills, rate := h.takeoverSettings()
	cl, err := h.privateCluster()
	if err != nil {
		return result{failed: err.Error()}
	}
	rdb := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
	defer func() { _ = rdb.Close() }() // the scenario is done
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error { return m.FlushAll(ctx).Err() }); err != nil {
		return result{failed: "FLUSHALL: " + err.Error()}
	}
	pipeline := filepath.Join(h.tmp, "takeover.hcl")
	if err := os.WriteFile(pipeline, []byte(takeoverHCL()), 0o644); err != nil {
		return result{failed: err.Error()}
	}
	args := []string{"run", pipeline, "--redis", strings.Join(cl.URLs(), ","), "--lease-ttl", ttl.String()}
	if *takeoverDebugFlag {
		args = append(args, "--log-level", "debug")
	}
	inspectArgs := []string{"inspect", pipeline, "--json", "--redis", strings.Join(cl.URLs(), ",")}

	var procs []*takeoverProc
	start := func() error {
		c, err := startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, args...)
		if err != nil {
			return err
		}
		procs = append(procs, &takeoverProc{c: c, tag: "-" + strconv.Itoa(c.cmd.Process.Pid) + "-"})
		return nil
	}
	defer func() {
		for _, p := range procs {
			if err := p.c.stop(30 * time.Second); err != nil && res.failed == "" {
				res.failed = "stopping: " + err.Error()
			}
		}
	}()
	for range takeoverProcs {
		if err := start(); err != nil {
			return result{failed: err.Error()}
		}
	}

	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	published := async(func() error { return publishSteadily(pubCtx, rdb, rate) })
	if n := *takeoverBusyFlag; n > 0 {
		busy, err := startChild("busy", h.logPath(scenario{name: "busy"}), nil, h.self, "child", "busy", "-g", strconv.Itoa(n))
		if err != nil {
			return result{failed: err.Error()}
		}
		defer func() { _ = busy.stop(5 * time.Second) }()
	}

	units := takeoverUnits()
	tr := &takeoverResult{ttl: ttl}
	res.takeover = tr
	for kill := range kills {
		// The three share every unit, the newest included, and have renewed their leases a few
		// times since: a process in its rhythm is killed, not one still starting.
		if err := waitShared(ctx, rdb, units, procs, 30*time.Second+20*ttl); err != nil {
			return failWith(res, fmt.Sprintf("kill %d: %v", kill+1, err))
		}
		time.Sleep(ttl)
		owners, err := leaseOwners(ctx, rdb, units)
		if err != nil {
			return failWith(res, err.Error())
		}
		victim := mostUnits(owners, procs)
		var held []int
		for i, o := range owners {
			if procs[victim].owns(o) {
				held = append(held, i)
			}
		}
		inspected := make(chan takeoverInspect, 1)
		inspCtx, stopInspect := context.WithCancel(ctx)
		killed := time.Now()
		if err := procs[victim].c.signal(syscall.SIGKILL); err != nil {
			stopInspect()
			return failWith(res, err.Error())
		}
		dead := procs[victim]
		procs = slices.Delete(procs, victim, victim+1)
		survivors := slices.Clone(procs) // procs grows again while inspect may still read these
		if *takeoverDebugFlag {
			fmt.Printf("takeover: kill %d at %s: pid%s held %d units\n", kill+1, killed.UTC().Format("15:04:05.000"), dead.tag, len(held))
		}
		go func() { inspected <- h.inspectUntilOwned(inspCtx, inspectArgs, units, held, dead, survivors, killed) }()
		k, err := watchTakeover(ctx, rdb, units, held, dead, survivors, killed, 30*ttl+30*time.Second)
		if err == nil {
			// inspect gets the time of a few of its runs more than the lease keys took.
			select {
			case in := <-inspected:
				k.inspect, k.inspRun = in.at, in.took
			case <-time.After(10*ttl + 10*time.Second):
			}
		}
		stopInspect()
		<-dead.c.done
		if err != nil {
			return failWith(res, fmt.Sprintf("kill %d: %v", kill+1, err))
		}
		tr.kills = append(tr.kills, k)
		if kill < kills-1 {
			if err := start(); err != nil {
				return failWith(res, err.Error())
			}
		}
	}
	stopPub()
	if err := <-published; err != nil && ctx.Err() == nil {
		return failWith(res, "publishing: "+err.Error())
	}
	if n, err := deliveredCount(ctx, rdb); err == nil {
		res.note("%d messages through to the sink", n)
	}
	return res
}

// failWith keeps the kills measured so far in a failed run's result.
func failWith(res result, why string) result {
	res.failed = why
	return res
}

// publishSteadily writes messages into the input topic at rate messages per second until ctx ends,
// each in the partition its key picks.
func publishSteadily(ctx context.Context, rdb *goredis.ClusterClient, rate float64) error {
	keys := redis.Keys{Prefix: takeoverPrefix}
	parts := keys.Streams("in", takeoverTopics[0].partitions)
	buf := make([]byte, payloadSize)
	start, sent := time.Now(), 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds() * rate)
		if due <= sent {
			continue
		}
		pipe := rdb.Pipeline()
		for ; sent < due; sent++ {
			putPayload(buf, time.Now().UnixNano(), phaseFlat, sent)
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: streamFor(parts, buf), Values: entryValues(formatPlain, slices.Clone(buf))})
		}
		if _, err := pipe.Exec(ctx); err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// leaseOwners returns the owner of each lease key ("" when nobody holds it), in one pipeline.
func leaseOwners(ctx context.Context, rdb *goredis.ClusterClient, units []string) ([]string, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*goredis.StringCmd, len(units))
	for i, k := range units {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	owners := make([]string, len(units))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err == goredis.Nil {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading lease %s: %w", units[i], err)
		}
		owners[i] = v // "<owner>#<token>": owns matches the owner part
	}
	return owners, nil
}

// waitShared waits until every unit is held by one of procs and each of them holds some.
func waitShared(ctx context.Context, rdb *goredis.ClusterClient, units []string, procs []*takeoverProc, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		owners, err := leaseOwners(ctx, rdb, units)
		if err != nil {
			return err
		}
		counts := make([]int, len(procs))
		all := true
		for _, o := range owners {
			i := slices.IndexFunc(procs, func(p *takeoverProc) bool { return p.owns(o) })
			if i < 0 {
				all = false
				continue
			}
			counts[i]++
		}
		if all && !slices.Contains(counts, 0) {
			return nil
		}
		for _, p := range procs {
			if p.c.exited() {
				return fmt.Errorf("a process exited: %s", p.c.logTail())
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the processes did not share the units within %s (units held: %v of %d)", limit, counts, len(units))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mostUnits returns the index of the process that holds the most units.
func mostUnits(owners []string, procs []*takeoverProc) int {
	best, most := 0, -1
	for i, p := range procs {
		n := 0
		for _, o := range owners {
			if p.owns(o) {
				n++
			}
		}
		if n > most {
			best, most = i, n
		}
	}
	return best
}

// takeoverPoll is how often the lease keys are read after a kill: short against a TTL.
const takeoverPoll = 5 * time.Millisecond

// watchTakeover reads the lease keys of the units the dead process held until survivors hold
// them all.
func watchTakeover(ctx context.Context, rdb *goredis.ClusterClient, units []string, held []int, dead *takeoverProc,
	survivors []*takeoverProc, killed time.Time, limit time.Duration) (takeoverKill, error) {
	k := takeoverKill{units: len(held)}
	mine := make([]string, len(held))
	for i, u := range held {
		mine[i] = units[u]
	}
	for {
		owners, err := leaseOwners(ctx, rdb, mine)
		at := time.Since(killed)
		if err != nil {
			return k, err
		}
		lapsed, owned := true, true
		for _, o := range owners {
			lapsed = lapsed && !dead.owns(o)
			owned = owned && slices.ContainsFunc(survivors, func(p *takeoverProc) bool { return p.owns(o) })
		}
		if lapsed && k.lapsed == 0 {
			k.lapsed = at
		}
		if owned {
			k.owned = at
			return k, nil
		}
		if at > limit {
			return k, fmt.Errorf("the survivors did not own the %d units of the killed process within %s (owners now: %v)", len(held), limit, owners)
		}
		time.Sleep(takeoverPoll)
	}
}

// takeoverInspect is when flowrun inspect first reported the dead process's units owned.
type takeoverInspect struct {
	at   time.Duration // when that run of inspect ended, from the kill; 0: never
	took time.Duration // how long that run took
}

// inspectUntilOwned runs flowrun inspect --json one run after the other until one reports every
// unit of held owned by a survivor.
func (h *harness) inspectUntilOwned(ctx context.Context, args, units []string, held []int, dead *takeoverProc,
	survivors []*takeoverProc, killed time.Time) takeoverInspect {
	want := map[string]bool{}
	for _, u := range held {
		want[units[u]] = true
	}
	keys := redis.Keys{Prefix: takeoverPrefix}
	for ctx.Err() == nil {
		began := time.Now()
		out, err := exec.CommandContext(ctx, h.flowrun, args...).Output()
		if err != nil {
			return takeoverInspect{}
		}
		var rep struct {
			Topics []struct {
				Name       string `json:"name"`
				Partitions []struct {
					Partition int `json:"partition"`
					Groups    []struct {
						Reader string `json:"reader"` // stage.NAME or sink.NAME
						Lease  *struct {
							Owner string `json:"owner"`
						} `json:"lease"`
					} `json:"groups"`
				} `json:"partitions"`
			} `json:"topics"`
		}
		if err := json.Unmarshal(out, &rep); err != nil {
			return takeoverInspect{}
		}
		owned := 0
		for _, t := range rep.Topics {
			for _, p := range t.Partitions {
				for _, g := range p.Groups {
					_, reader, _ := strings.Cut(g.Reader, ".")
					if !want[keys.Lease(t.Name, p.Partition, reader)] || g.Lease == nil || dead.owns(g.Lease.Owner) {
						continue
					}
					if slices.ContainsFunc(survivors, func(s *takeoverProc) bool { return s.owns(g.Lease.Owner) }) {
						owned++
					}
				}
			}
		}
		if owned == len(want) {
			return takeoverInspect{at: time.Since(killed), took: time.Since(began)}
		}
	}
	return takeoverInspect{}
}

// deliveredCount adds up the entries the sink has read from its input's partitions.
func deliveredCount(ctx context.Context, rdb *goredis.ClusterClient) (int64, error) {
	keys := redis.Keys{Prefix: takeoverPrefix}
	var n int64
	last := len(takeoverTopics) - 1
	for _, s := range keys.Streams(takeoverTopics[last].name, takeoverTopics[last].partitions) {
		groups, err := rdb.XInfoGroups(ctx, s).Result()
		if err != nil {
			return 0, err
		}
		for _, g := range groups {
			if g.Name == takeoverReaders[last] {
				n += g.EntriesRead - g.Pending
			}
		}
	}
	return n, nil
}

// busyLoop spins on g goroutines until the process is stopped: a machine busy with other work.
func busyLoop(g int) error {
	var wg sync.WaitGroup
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := uint64(1)
			for {
				x = x*6364136223846793005 + 1442695040888963407
				if x == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// inTTLs is a duration in lease TTLs.
func (t *takeoverResult) inTTLs(d time.Duration) float64 { return float64(d) / float64(t.ttl) }

// takeoverLine is the progress line's figures of a run.
func (t *takeoverResult) line() string {
	var owned, insp []string
	for _, k := range t.kills {
		owned = append(owned, fmt.Sprintf("%.2f", t.inTTLs(k.owned)))
		if k.inspect > 0 {
			insp = append(insp, fmt.Sprintf("%.2f", t.inTTLs(k.inspect)))
		} else {
			insp = append(insp, "-")
		}
	}
	return fmt.Sprintf("TTL %s, %d kills: owned again after %s TTLs (inspect saw it after %s)", t.ttl, len(t.kills),
		strings.Join(owned, " "), strings.Join(insp, " "))
}

// takeoverReport is the table of every kill of every round, and the budget's figure: the slowest.
func takeoverReport(results map[string][]result, quick bool) string {
	var b strings.Builder
	var all []float64
	for round, r := range results["TAKEOVER"] {
		if r.takeover == nil {
			continue
		}
		t := r.takeover
		for i, k := range t.kills {
			if b.Len() == 0 {
				fmt.Fprintf(&b, "\nTakeover (3 processes, 37 units, a 3-master cluster, messages flowing; SIGKILL of the process holding most units, lease TTL %s)\n\n", t.ttl)
				b.WriteString("| round | kill | units it held | its leases lapsed, s | owned again, s | owned again, TTLs | inspect saw it, s (that run took, s) |\n")
				b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
			}
			insp := "-"
			if k.inspect > 0 {
				insp = fmt.Sprintf("%.2f (%.2f)", k.inspect.Seconds(), k.inspRun.Seconds())
			}
			fmt.Fprintf(&b, "| %d | %d | %d | %.2f | %.2f | %.2f | %s |\n", round+1, i+1, k.units, k.lapsed.Seconds(), k.owned.Seconds(), t.inTTLs(k.owned), insp)
			all = append(all, t.inTTLs(k.owned))
		}
	}
	if len(all) == 0 {
		return b.String()
	}
	sort.Float64s(all)
	fmt.Fprintf(&b, "\nOwned again after %.2f TTLs at the median, %.2f at most, over %d kills", median(all), all[len(all)-1], len(all))
	if !quick {
		fmt.Fprintf(&b, " (budget: at most 1.5 TTLs: %s)", verdict(true, all[len(all)-1] <= 1.5))
	}
	b.WriteString(".\n")
	return b.String()
}
