package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(M(m)) }

func TestStartServesAndStops(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	if !strings.HasPrefix(s.URL(), "redis://127.0.0.1:") {
		t.Fatalf("URL = %q", s.URL())
	}
	rdb := s.Client(t)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cfg, err := rdb.ConfigGet(ctx, "appendonly").Result()
	if err != nil {
		t.Fatal(err)
	}
	if cfg["appendonly"] != "no" {
		t.Fatalf("appendonly = %q, want no", cfg["appendonly"])
	}
	pid := s.Pid()
	if pid == 0 {
		t.Fatal("Pid() = 0 for a running server")
	}
	s.Stop()
	if s.Pid() != 0 {
		t.Fatal("Pid() != 0 after Stop")
	}
	if err := ping(s.Addr(), probeTimeout); err == nil {
		t.Fatal("server still answers after Stop")
	}
}

func TestRestartWithoutAOFLosesData(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	rdb := s.Client(t)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	n, err := rdb.Exists(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("data survived a restart without persistence")
	}
}

func TestAOFSurvivesKill(t *testing.T) {
	ctx := context.Background()
	s := Start(t, WithAOF())
	rdb := s.Client(t)
	for i := range 100 {
		if err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: "s", Values: []string{"n", fmt.Sprint(i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	oldPid := s.Pid()
	s.Kill()
	s.Start(t)
	if s.Pid() == oldPid {
		t.Fatal("same pid after Kill and Start")
	}
	n, err := rdb.XLen(ctx, "s").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 100 {
		t.Fatalf("XLEN after kill+start = %d, want 100", n)
	}
	s.Restart(t)
	if n, _ := rdb.XLen(ctx, "s").Result(); n != 100 {
		t.Fatalf("XLEN after restart = %d, want 100", n)
	}
}

func TestWithArgs(t *testing.T) {
	s := Start(t, WithArgs("--maxmemory", "7mb"))
	cfg, err := s.Client(t).ConfigGet(context.Background(), "maxmemory").Result()
	if err != nil {
		t.Fatal(err)
	}
	if cfg["maxmemory"] != fmt.Sprint(7*1024*1024) {
		t.Fatalf("maxmemory = %q", cfg["maxmemory"])
	}
}

func TestLaunchReportsPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	s := &Server{bin: mustLookPath(t), dir: dir, port: l.Addr().(*net.TCPAddr).Port}
	err = s.launch()
	if !errors.Is(err, errPortInUse) {
		t.Fatalf("launch on a taken port: err = %v, want errPortInUse", err)
	}
}

func TestMissingBinaryExplainsInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := startServer()
	if err == nil || !strings.Contains(err.Error(), "apt-get install redis-server") {
		t.Fatalf("err = %v, want the install hint", err)
	}
}

func TestCluster(t *testing.T) {
	ctx := context.Background()
	c := StartCluster(t, 3)
	if len(c.Addrs()) != 3 || len(c.URLs()) != 3 {
		t.Fatalf("Addrs = %v", c.Addrs())
	}
	cc := c.Client(t)
	for i := range 300 {
		if err := cc.Set(ctx, fmt.Sprintf("key-%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Every master got some of the keys: the slots are spread over all of them.
	for _, node := range c.Nodes() {
		n, err := node.Client(t).DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("node %s holds no keys", node.Addr())
		}
	}
	var total atomic.Int64 // ForEachMaster calls the function concurrently
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
		n, err := m.DBSize(ctx).Result()
		total.Add(n)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if total.Load() != 300 {
		t.Fatalf("keys over all masters = %d, want 300", total.Load())
	}
}

func TestSharedIsStartedOnce(t *testing.T) {
	a, b := Shared(t), Shared(t)
	if a != b {
		t.Fatal("Shared returned two servers")
	}
	if err := a.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	c1, c2 := SharedCluster(t, 2), SharedCluster(t, 2)
	if c1 != c2 {
		t.Fatal("SharedCluster returned two clusters")
	}
}

func TestStartClusterRejectsZero(t *testing.T) {
	if _, err := startCluster(0); err == nil {
		t.Fatal("startCluster(0) succeeded")
	}
}

func mustLookPath(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(InstallHint)
	}
	return bin
}

func TestTLS(t *testing.T) {
	ctx := context.Background()
	s := Start(t, WithTLS())
	if !strings.HasPrefix(s.TLSURL(), "rediss://127.0.0.1:") || s.TLSAddr() == s.Addr() {
		t.Fatalf("TLSURL = %q, Addr = %q", s.TLSURL(), s.Addr())
	}
	c := goredis.NewClient(&goredis.Options{Addr: s.TLSAddr(), TLSConfig: s.TLSConfig()})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	if Start(t).TLSConfig() != nil {
		t.Fatal("TLSConfig without WithTLS")
	}
}

func TestTLSClientAuth(t *testing.T) {
	ctx := context.Background()
	s := Start(t, WithTLSClientAuth())
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(s.TLSCAFile())
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("the CA file %s: %v", s.TLSCAFile(), err)
	}
	certFile, keyFile := s.TLSClientFiles()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cfg *tls.Config
		ok  bool
	}{
		"no client certificate": {&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, false},
		"the client files":      {&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, true},
		"TLSConfig":             {s.TLSConfig(), true},
	} {
		c := goredis.NewClient(&goredis.Options{Addr: s.TLSAddr(), TLSConfig: tc.cfg, MaxRetries: -1})
		err := c.Ping(ctx).Err()
		_ = c.Close()
		if (err == nil) != tc.ok {
			t.Errorf("%s: PING over TLS: %v, want success %v", name, err, tc.ok)
		}
	}
	// The plain port asks for nothing.
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// A cluster with WithTLSClientAuth: one CA for every node, the bus over TLS (the cluster forms
// only if the nodes' handshakes with each other succeed), and a TLS client that follows the slots
// to every node's TLS port.
func TestTLSCluster(t *testing.T) {
	ctx := context.Background()
	c := StartCluster(t, 3, WithTLSClientAuth())
	urls := c.TLSURLs()
	if len(urls) != 3 || c.TLSConfig() == nil || c.TLSCAFile() == "" {
		t.Fatalf("TLSURLs = %v", urls)
	}
	addrs := make([]string, len(urls))
	for i, u := range urls {
		addrs[i] = strings.TrimPrefix(u, "rediss://")
	}
	for _, s := range c.Nodes() {
		info, err := s.Client(t).ConfigGet(ctx, "tls-cluster").Result()
		if err != nil || info["tls-cluster"] != "yes" {
			t.Fatalf("%s: tls-cluster = %v (%v)", s.Addr(), info, err)
		}
	}
	// Seeded with one node only, the client finds the others through CLUSTER SLOTS, which must
	// answer a TLS connection with the TLS ports.
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs[:1], TLSConfig: c.TLSConfig(), MaxRetries: -1})
	defer func() { _ = cc.Close() }()
	for i := range 100 {
		if err := cc.Set(ctx, fmt.Sprintf("key-%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET over TLS: %v", err)
		}
	}
	var masters []string
	var mu sync.Mutex
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
		mu.Lock()
		masters = append(masters, m.Options().Addr)
		mu.Unlock()
		return nil
	})
	sort.Strings(masters)
	sort.Strings(addrs)
	if err != nil || strings.Join(masters, ",") != strings.Join(addrs, ",") {
		t.Fatalf("the TLS client's masters are %v, want the TLS addresses %v (%v)", masters, addrs, err)
	}
	for _, node := range c.Nodes() {
		if n, err := node.Client(t).DBSize(ctx).Result(); err != nil || n == 0 {
			t.Errorf("node %s holds %d keys (%v)", node.Addr(), n, err)
		}
	}
}
