package redistest

import (
	"fmt"
	"sync"
	"testing"
)

// The shared instances of a test binary. They are started on first use and stopped by the
// wrapper that M returns, after every test of the package has run.
var shared struct {
	mu       sync.Mutex
	server   *Server
	clusters map[int]*Cluster
	errs     map[string]error // a failed start is not retried by every later test
}

// Shared returns one plain server (no persistence) shared by every test of the package that
// calls it. It is started on first use; the package's TestMain must wrap m with M so that it is
// stopped at the end:
//
//	func TestMain(m *testing.M) { os.Exit(redistest.M(m).Run()) }
//
// or, with goleak (the shared servers are stopped before goleak looks for leaks):
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }
//
// Tests that share a server must not interfere: give each test its own key prefix, and do not
// FLUSHALL. Tests that stop, kill or restart Redis, or change its configuration, must use Start.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if err := shared.errs["server"]; err != nil {
		t.Fatalf("redistest: shared server: %v", err)
	}
	if shared.server == nil {
		s, err := startServer()
		if err != nil {
			setSharedErr("server", err)
			t.Fatalf("redistest: shared server: %v", err)
		}
		shared.server = s
	}
	return shared.server
}

// SharedCluster returns a cluster with the given number of masters shared by every test of the
// package that asks for that size; see Shared for the TestMain that stops it.
func SharedCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	name := fmt.Sprintf("cluster-%d", masters)
	if err := shared.errs[name]; err != nil {
		t.Fatalf("redistest: shared cluster: %v", err)
	}
	if c := shared.clusters[masters]; c != nil {
		return c
	}
	c, err := startCluster(masters)
	if err != nil {
		setSharedErr(name, err)
		t.Fatalf("redistest: shared cluster: %v", err)
	}
	if shared.clusters == nil {
		shared.clusters = map[int]*Cluster{}
	}
	shared.clusters[masters] = c
	return c
}

func setSharedErr(name string, err error) {
	if shared.errs == nil {
		shared.errs = map[string]error{}
	}
	shared.errs[name] = err
}

// StopShared stops every shared server and cluster. M's wrapper calls it; call it yourself only
// from a TestMain that does not use M.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server != nil {
		shared.server.shutdown()
		shared.server = nil
	}
	for n, c := range shared.clusters {
		c.shutdown()
		delete(shared.clusters, n)
	}
}

// TestingM is what testing.M, goleak.VerifyTestMain and M have in common.
type TestingM interface {
	Run() int
}

// M wraps m so that its Run stops the shared servers and clusters after the tests have run.
func M(m TestingM) TestingM { return runner{m} }

type runner struct{ m TestingM }

func (r runner) Run() int {
	defer StopShared()
	return r.m.Run()
}
