package runtime_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

var binaries sync.Map // package path -> *builtBinary

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// buildBinary builds a flowrun command (the stock one, or one with test stage functions) once per
// test binary.
func buildBinary(t *testing.T, pkg string) string {
	t.Helper()
	v, _ := binaries.LoadOrStore(pkg, &builtBinary{})
	b := v.(*builtBinary)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "flowrun-bin")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "flowrun")
		args := []string{"build", "-o", b.path}
		if raceEnabled {
			// The children of a test binary with the race detector have it too (make test).
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go %s: %v\n%s", strings.Join(append(args, pkg), " "), err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// flowrunBinary builds the stock flowrun command.
func flowrunBinary(t *testing.T) string { return buildBinary(t, "../cmd/flowrun") }

// process is a flowrun process started by a test.
type process struct {
	cmd *exec.Cmd
	log *syncBuffer
}

func startProcess(t *testing.T, args ...string) *process {
	t.Helper()
	return startBinary(t, flowrunBinary(t), args...)
}

func startBinary(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin, args...), log: &syncBuffer{}}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = waitProcess(t, p)
		}
		// A child built with the race detector reports a race on its standard error as soon as it
		// sees one, also when the test kills it afterwards.
		if strings.Contains(p.log.String(), "WARNING: DATA RACE") {
			t.Errorf("%s %s: a data race:\n%s", filepath.Base(bin), strings.Join(args, " "), p.log.String())
		}
	})
	return p
}

// processDeadline is how long a test waits for a flowrun process to exit: far longer than any of
// them takes, so that a regression fails the test with the process's log instead of hanging it
// until the test binary's own limit.
const processDeadline = 2 * time.Minute

// waitProcess waits for a flowrun process to exit, for at most processDeadline; a process still
// running then is killed, and the error has its log.
func waitProcess(t *testing.T, p *process) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	timer := time.NewTimer(processDeadline)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		waitErr := <-done
		return fmt.Errorf("%s still running after %s, killed (%v); its log:\n%s", strings.Join(p.cmd.Args, " "), processDeadline, waitErr, p.log.String())
	}
}

// kill sends SIGKILL to a process and waits for it to be gone.
func (p *process) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = waitProcess(t, p) // killed: its exit status says so
}

// leaseLosses counts the times a log says that its process lost a partition's lease (a renewal
// that found it gone, or an ack refused because another process owns the partition). Each lets
// the batch that the unit had in flight be processed again by the next owner, so each allows at
// most one batch of duplicates under at-least-once delivery; without one, a single server
// delivers nothing twice.
func leaseLosses(logs ...string) int {
	n := 0
	for _, l := range logs {
		n += strings.Count(l, "lease lost; stopping the partition") + strings.Count(l, "lost the partition to another process")
	}
	return n
}

// pendingFor sums, over a topic's partitions, the entries a group has delivered and not yet
// acknowledged (for one consumer, or for all with consumer ""): right after a process is killed,
// its batches in flight, the only ones that the next owner can process a second time.
func pendingFor(t *testing.T, c *redis.Client, keys redis.Keys, topic string, partitions int, group, consumer string) int {
	t.Helper()
	n := 0
	for p := 0; p < partitions; p++ {
		stream := keys.Stream(topic, p)
		if consumer == "" {
			st, err := c.StreamStats(context.Background(), stream)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range st.Groups {
				if g.Name == group {
					n += int(g.Pending)
				}
			}
			continue
		}
		pend, err := c.Universal().XPendingExt(context.Background(), &goredis.XPendingExtArgs{
			Stream: stream, Group: group, Start: "-", End: "+", Count: 1 << 20, Consumer: consumer,
		}).Result()
		if err != nil && !strings.Contains(err.Error(), "NOGROUP") {
			t.Fatal(err)
		}
		n += len(pend)
	}
	return n
}

// TestProcessesSharePartitionsAndTakeOver starts two flowrun processes on one pipeline: they split its
// partitions evenly and deliver a first part of the messages. The second part is held back in
// every partition by a gate (faults.hold), so that when one of the processes is killed with SIGKILL
// it has batches in flight for sure: its leases expire, the other takes every partition over with
// the entries the dead one had read, and every message arrives, once: on a single server a
// process that is killed leaves no duplicate unless it had lost a lease.
func TestProcessesSharePartitionsAndTakeOver(t *testing.T) {
	t.Parallel()
	const first, second, third, partitions = 2000, 2000, 1000, 8
	const n = first + second + third
	ctx := context.Background()
	bin := buildBinary(t, "./testdata/flowrun-faults")
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("procs-%d", prefixes.Add(1))
	out := prefix + ":out"
	dir := t.TempDir()
	path := filepath.Join(dir, "pipeline.hcl")
	writeFile(t, path, fmt.Sprintf(`
pipeline "shared" {
  key_prefix = %q
}
topic "in" {
  partitions = %d
  key        = msg.k
}
stage "work" {
  kind  = "go"
  func  = "faults.hold"
  input = topic.in
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.work
  stream = %q
}
`, prefix, partitions, out))
	plan, _, diags := flow.Build(path, flow.Options{GoFuncs: []string{"faults.hold"}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	keys := redis.Keys{Prefix: prefix}
	var leaseKeys []string
	for p := 0; p < partitions; p++ {
		leaseKeys = append(leaseKeys, keys.Lease("in", p, "work"), keys.Lease("work.out", p, "out"))
	}
	owners := func() map[string]int {
		held := map[string]int{}
		for _, k := range leaseKeys {
			if l, _, ok, err := c.LeaseHolder(ctx, k); err == nil && ok {
				held[l.Owner]++
			}
		}
		return held
	}

	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "2s", "--log-level", "debug"}
	procs := []*process{startBinary(t, bin, args...), startBinary(t, bin, args...)}
	waitFor(t, "two processes to hold 8 of the 16 partitions each", func() bool {
		held := owners()
		if len(held) != 2 {
			return false
		}
		for _, n := range held {
			if n != partitions {
				return false
			}
		}
		return true
	})

	// The gate: held messages wait until the file gate exists; each says it is held by creating
	// its own "entered" file.
	gate := filepath.Join(dir, "open")
	var entered []string
	publish := func(from, to int, hold bool) {
		pub, err := runtime.NewPublisher(c, plan)
		if err != nil {
			t.Fatal(err)
		}
		heldIn := map[int]bool{}
		for i := from; i < to; i++ {
			k := fmt.Sprintf("k%d", i%50)
			body := fmt.Sprintf(`{"k":%q,"i":%d}`, k, i)
			// The first message of each partition is held: nothing behind it in its partition
			// can arrive before the gate opens.
			if p := redis.Partition(k, partitions); hold && !heldIn[p] {
				heldIn[p] = true
				e := filepath.Join(dir, fmt.Sprintf("entered-%d", i))
				entered = append(entered, e)
				body = fmt.Sprintf(`{"k":%q,"i":%d,"hold":%q,"entered":%q}`, k, i, gate, e)
			}
			if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(body), nil)); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	delivered := func() map[int]int { return arrivals(t, c, out) }
	publish(0, first, false)
	waitFor(t, "the first messages through both processes", func() bool { return len(delivered()) == first })
	publish(first, first+second, true)
	waitFor(t, "a held message in every partition", func() bool {
		for _, e := range entered {
			if _, err := os.Stat(e); err != nil {
				return false
			}
		}
		return true
	})

	// The victim is the owner of a partition whose held batch is in flight (either process may be).
	ids := make([]string, len(procs))
	startLine := regexp.MustCompile(`msg="pipeline starting" .*?process=(\S+)`)
	for i, p := range procs {
		m := startLine.FindStringSubmatch(p.log.String())
		if m == nil {
			t.Fatalf("no process ID in the log:\n%s", p.log.String())
		}
		ids[i] = m[1]
	}
	heldLease, _, ok, err := c.LeaseHolder(ctx, keys.Lease("in", redis.Partition("k0", partitions), "work"))
	if err != nil || !ok {
		t.Fatalf("the lease of a held partition: %v, %v", ok, err)
	}
	victim := slices.Index(ids, heldLease.Owner)
	if victim < 0 {
		t.Fatalf("the held partition is owned by %q, not by %v", heldLease.Owner, ids)
	}
	dead, survivor := procs[victim], procs[1-victim]

	// SIGKILL: no lease is released, no batch finished; the survivor must wait for the leases to expire.
	killed := time.Now()
	dead.kill(t)
	if got := len(delivered()); got != first {
		t.Fatalf("%d messages had arrived when the process was killed, want the %d before the held ones", got, first)
	}
	inFlight := pendingFor(t, c, keys, "in", partitions, "work", ids[victim])
	if inFlight == 0 {
		t.Fatal("the killed process had no batch in flight: nothing was killed mid-stream")
	}
	writeFile(t, gate, "")
	publish(first+second, n, false)
	waitFor(t, "the survivor to hold all 16 partitions", func() bool {
		held := owners()
		return len(held) == 1 && held[ids[1-victim]] == 2*partitions
	})
	t.Logf("the survivor held every partition %s after the kill (lease TTL 2s)", time.Since(killed).Round(10*time.Millisecond))
	waitFor(t, "every message", func() bool { return len(delivered()) == n })
	if err := survivor.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitProcess(t, survivor); err != nil {
		t.Fatalf("the survivor did not exit cleanly on SIGTERM: %v\n%s", err, survivor.log.String())
	}
	dups := tally(t, delivered(), n)
	// A single server commits a batch's outputs and acks in one transaction: the entries the
	// killed process had in flight are processed again by the survivor, but written once. Only a
	// lost lease (a process stalled past the 2s TTL) lets a batch, at most 1000 entries, be
	// written twice.
	losses := leaseLosses(dead.log.String(), survivor.log.String())
	t.Logf("%d messages delivered, %d entries in flight at the kill, %d duplicates, %d leases lost", n, inFlight, dups, losses)
	if dups > losses*redis.DefaultReadCount {
		t.Errorf("%d duplicates after a SIGKILL on a single server with %d leases lost: want at most %d",
			dups, losses, losses*redis.DefaultReadCount)
	}
}
