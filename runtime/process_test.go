package runtime_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

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
		if out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
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
			_ = p.cmd.Wait()
		}
	})
	return p
}

// TestProcessesSharePartitionsAndTakeOver starts two flowrun processes on one pipeline: they split its
// partitions about evenly. One is then killed with SIGKILL, leaving its leases to expire: the other
// takes all partitions over and every message arrives, none lost.
func TestProcessesSharePartitionsAndTakeOver(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("procs-%d", time.Now().UnixNano())
	out := prefix + ":out"
	path := filepath.Join(t.TempDir(), "pipeline.hcl")
	writeFile(t, path, fmt.Sprintf(`
pipeline "shared" {
  key_prefix = %q
}
topic "in" {
  partitions = 8
  key        = msg.k
}
stage "work" {
  kind  = "map"
  input = topic.in
  set   = { worked = true }
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.work
  stream = %q
}
`, prefix, out))
	plan, _, diags := flow.Build(path, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	keys := redis.Keys{Prefix: prefix}
	var leaseKeys []string
	for p := 0; p < 8; p++ {
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
	a := startProcess(t, args...)
	b := startProcess(t, args...)
	waitFor(t, "two processes to hold 8 of the 16 partitions each", func() bool {
		held := owners()
		if len(held) != 2 {
			return false
		}
		for _, n := range held {
			if n != 8 {
				return false
			}
		}
		return true
	})

	publish := func(from, to int) {
		pub, err := runtime.NewPublisher(c, plan)
		if err != nil {
			t.Fatal(err)
		}
		for i := from; i < to; i++ {
			m := stages.NewMessage("", []byte(fmt.Sprintf(`{"k":"k%d","i":%d}`, i%50, i)), nil)
			if err := pub.Publish(ctx, "in", m); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	delivered := func() map[float64]int {
		entries, err := c.Universal().XRange(ctx, out, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[float64]int{}
		for _, e := range entries {
			seen[jsonObject(t, e.Values["payload"].(string))["i"].(float64)]++
		}
		return seen
	}
	publish(0, 2000)
	waitFor(t, "2000 messages through both processes", func() bool { return len(delivered()) == 2000 })

	// SIGKILL: no lease is released, no batch finished; the survivor must wait for the leases to expire.
	killed := time.Now()
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b.cmd.Wait()
	publish(2000, 4000)
	waitFor(t, "the survivor to hold all 16 partitions", func() bool {
		held := owners()
		return len(held) == 1 && held[firstKey(held)] == 16
	})
	t.Logf("the survivor held every partition %s after the kill (lease TTL 2s)", time.Since(killed).Round(10*time.Millisecond))
	waitFor(t, "all 4000 messages", func() bool { return len(delivered()) == 4000 })
	dups := 0
	for _, n := range delivered() {
		dups += n - 1
	}
	t.Logf("4000 messages delivered, %d duplicates (at-least-once after a SIGKILL)", dups)

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("the survivor did not exit cleanly on SIGTERM: %v\n%s", err, a.log.String())
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}
