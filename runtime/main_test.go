package runtime_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/embedded"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The tests share one redis-server and one 3-master cluster (see redistest); each test isolates
// itself with a key prefix of its own. A test that spends most of its time waiting (on the
// processes it starts, on a broker, on a lease to lapse) calls t.Parallel, so that make test runs
// several at once (go test -parallel 4): one after another they took 13 minutes under the race
// detector. A test that measures the process (allocations, goroutines) or changes what the
// package shares (GOMAXPROCS, the server's ACL log) stays sequential.
func TestMain(m *testing.M) { goleak.VerifyTestMain(cleanup{redistest.M(m)}) }

// cleanup removes the binaries the tests built once the tests are done.
type cleanup struct{ goleak.TestingM }

func (c cleanup) Run() int {
	code := c.TestingM.Run()
	binaries.Range(func(_, v any) bool {
		if b := v.(*builtBinary); b.path != "" {
			_ = os.RemoveAll(filepath.Dir(b.path))
		}
		return true
	})
	return code
}

// backend is a Redis to run pipelines on.
type backend struct {
	name string
	open func(t *testing.T) *redis.Client
}

func openURLs(t *testing.T, urls ...string) *redis.Client {
	t.Helper()
	c, err := redis.Open(context.Background(), redis.Options{URLs: urls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var (
	server = backend{"server", func(t *testing.T) *redis.Client { return openURLs(t, redistest.Shared(t).URL()) }}
	// cluster runs on a local 3-master Redis Cluster.
	cluster = backend{"cluster", func(t *testing.T) *redis.Client {
		return openURLs(t, redistest.SharedCluster(t, 3).URLs()...)
	}}
	// embeddedRedis is the embedded default of flowrun run (miniredis).
	embeddedRedis = backend{"embedded", func(t *testing.T) *redis.Client {
		srv, err := embedded.Start()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		return openURLs(t, srv.URL())
	}}
	allBackends = []backend{server, cluster, embeddedRedis}
)

var prefixes atomic.Int64

// build compiles a pipeline with this binary's Go stage functions and gives it a key prefix of its
// own, so that tests sharing a Redis never see each other's keys.
func build(t *testing.T, path string, vars ...string) *flow.Plan {
	t.Helper()
	plan, _, diags := flow.Build(path, flow.Options{Vars: vars, GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan.KeyPrefix = "t" + itoa(prefixes.Add(1)) + "-" + strings.ReplaceAll(t.Name(), "/", "-")
	return plan
}

// buildSource compiles a pipeline from source text.
func buildSource(t *testing.T, src string, vars ...string) *flow.Plan {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pipeline.hcl")
	writeFile(t, path, src)
	return build(t, path, vars...)
}

// job is the result of running a pipeline in job mode.
type job struct {
	summary *runtime.Summary
	stdout  string
	log     string
}

// runJob runs a plan until it is drained. The deadline only keeps a broken test from hanging.
func runJob(t *testing.T, c *redis.Client, plan *flow.Plan, opts runtime.Options) job {
	t.Helper()
	return runJobWithin(t, c, plan, opts, 2*time.Minute)
}

// runJobWithin is runJob with a deadline of its own, for jobs that may take long on a loaded
// machine (the embedded Redis runs its scripts in an interpreter).
func runJobWithin(t *testing.T, c *redis.Client, plan *flow.Plan, opts runtime.Options, deadline time.Duration) job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var stdout, log syncBuffer
	opts.Redis = c
	opts.UntilDrained = true
	if opts.Stdout == nil {
		opts.Stdout = &stdout
	}
	if opts.Stdin == nil {
		opts.Stdin = strings.NewReader("")
	}
	opts.Logger = newLogger(&log)
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 10 * time.Second // the default: a loaded CI machine must not lose leases mid-test
	}
	summary, err := runtime.Run(ctx, plan, opts)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("the job did not finish:\n%s", log.String())
	}
	checkEndsCleanly(t, log.String())
	return job{summary: summary, stdout: stdout.String(), log: log.String()}
}

// newLogger logs everything, for the test's failure messages.
func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// node returns a node's counts from a summary.
func (j job) node(t *testing.T, name string) runtime.NodeSummary {
	t.Helper()
	for _, n := range j.summary.Nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s in the summary", name)
	return runtime.NodeSummary{}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
