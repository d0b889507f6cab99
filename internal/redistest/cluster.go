package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// clusterTimeout bounds how long StartCluster waits for every node to report cluster_state:ok
// with the same slot map.
const clusterTimeout = 30 * time.Second

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = 16384

// Cluster is a local Redis Cluster of masters without replicas, each a Server on its own free
// loopback port (and its own free cluster-bus port).
type Cluster struct {
	nodes  []*Server
	tlsDir string // the certificates the nodes share, with WithTLS
}

// StartCluster starts a Redis Cluster with the given number of masters (at least 1), assigns the
// 16384 slots in equal ranges, and waits until every node reports cluster_state:ok and all nodes
// agree on the slot map. The cluster is stopped when the test ends.
func StartCluster(t testing.TB, masters int, opts ...Option) *Cluster {
	t.Helper()
	c, err := startCluster(masters, opts...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.shutdown)
	return c
}

func startCluster(masters int, opts ...Option) (*Cluster, error) {
	if masters < 1 {
		return nil, fmt.Errorf("a cluster needs at least 1 master, got %d", masters)
	}
	opts = append([]Option{func(c *config) { c.cluster = true }}, opts...)
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cluster{}
	if cfg.tls {
		// One CA for every node: the nodes trust each other on the bus, and a client trusts them all.
		dir, err := os.MkdirTemp("", "redistest-tls-")
		if err != nil {
			return nil, fmt.Errorf("creating the TLS directory: %w", err)
		}
		c.tlsDir = dir
		files, err := writeTLSFiles(dir)
		if err != nil {
			c.shutdown()
			return nil, fmt.Errorf("generating TLS certificates: %w", err)
		}
		opts = append(opts, func(c *config) { c.tlsFiles = files })
	}
	for range masters {
		s, err := startServer(opts...)
		if err != nil {
			c.shutdown()
			return nil, err
		}
		c.nodes = append(c.nodes, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.form(ctx); err != nil {
		c.shutdown()
		return nil, err
	}
	return c, nil
}

// form assigns slots, introduces the nodes to each other and waits for convergence.
func (c *Cluster) form(ctx context.Context) error {
	n := len(c.nodes)
	for i, s := range c.nodes {
		// Distinct config epochs avoid the epoch-collision dance, as redis-cli --cluster create does.
		if _, err := s.do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1); err != nil {
			return fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", s.Addr(), err)
		}
		lo, hi := i*slotCount/n, (i+1)*slotCount/n-1
		if _, err := s.do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, s.Addr(), err)
		}
	}
	first := c.nodes[0]
	for _, s := range c.nodes[1:] {
		if _, err := first.do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.port, s.busPort); err != nil {
			return fmt.Errorf("CLUSTER MEET %s: %w", s.Addr(), err)
		}
	}
	return c.waitConverged(ctx)
}

// waitConverged polls every node until each reports cluster_state:ok, knows every node, has all
// slots assigned, and returns the same CLUSTER SLOTS map as the others.
func (c *Cluster) waitConverged(ctx context.Context) error {
	backoff := 10 * time.Millisecond
	var why string
	for {
		ok, reason := c.converged(ctx)
		if ok {
			return nil
		}
		why = reason
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster did not converge: %s", why)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

func (c *Cluster) converged(ctx context.Context) (bool, string) {
	var want string
	for i, s := range c.nodes {
		info, err := s.do(ctx, "CLUSTER", "INFO")
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER INFO: %v", s.Addr(), err)
		}
		text, _ := info.(string)
		for _, need := range []string{
			"cluster_state:ok",
			fmt.Sprintf("cluster_known_nodes:%d", len(c.nodes)),
			fmt.Sprintf("cluster_slots_assigned:%d", slotCount),
		} {
			if !strings.Contains(text, need) {
				return false, fmt.Sprintf("%s: no %q yet", s.Addr(), need)
			}
		}
		slots, err := s.do(ctx, "CLUSTER", "SLOTS")
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER SLOTS: %v", s.Addr(), err)
		}
		got := slotMap(slots)
		if i == 0 {
			want = got
		} else if got != want {
			return false, fmt.Sprintf("%s sees slots %s, %s sees %s", s.Addr(), got, c.nodes[0].Addr(), want)
		}
	}
	return true, ""
}

// slotMap renders a CLUSTER SLOTS reply as "lo-hi@port" ranges in a canonical order.
func slotMap(reply any) string {
	rows, _ := reply.([]any)
	var parts []string
	for _, r := range rows {
		row, _ := r.([]any)
		if len(row) < 3 {
			continue
		}
		master, _ := row[2].([]any)
		if len(master) < 2 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%v-%v@%v", row[0], row[1], master[1]))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Nodes returns the cluster's servers, in slot order (node i serves the i-th slot range).
func (c *Cluster) Nodes() []*Server { return c.nodes }

// Addrs returns the host:port of every master.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.Addr()
	}
	return out
}

// URLs returns the redis:// URL of every master.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.URL()
	}
	return out
}

// Client returns a go-redis cluster client seeded with every master, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *goredis.ClusterClient {
	t.Helper()
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TLSURLs returns the rediss:// URL of every master (nil without WithTLS).
func (c *Cluster) TLSURLs() []string {
	if c.tlsDir == "" {
		return nil
	}
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.TLSURL()
	}
	return out
}

// TLSConfig returns a client TLS configuration that trusts the nodes' CA (nil without WithTLS);
// with WithTLSClientAuth it presents the harness's client certificate.
func (c *Cluster) TLSConfig() *tls.Config { return c.nodes[0].TLSConfig() }

// TLSCAFile returns the PEM file of the CA that signed every node's certificate ("" without
// WithTLS).
func (c *Cluster) TLSCAFile() string { return c.nodes[0].TLSCAFile() }

// TLSClientFiles returns the PEM files of a client certificate and its key signed by the nodes'
// CA ("", "" without WithTLS).
func (c *Cluster) TLSClientFiles() (cert, key string) { return c.nodes[0].TLSClientFiles() }

func (c *Cluster) shutdown() {
	for _, s := range c.nodes {
		s.shutdown()
	}
	if c.tlsDir != "" {
		_ = os.RemoveAll(c.tlsDir)
	}
}
