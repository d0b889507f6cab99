package redis

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/goleak"

	"github.com/flowrun/flowrun/internal/redistest"
)

// The tests share one redis-server and one 3-master cluster per test binary (see redistest);
// each test isolates itself with its own key prefix.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }

// backend is a Redis to run a test against.
type backend struct {
	name string
	open func(t *testing.T) *Client
}

func openURLs(t *testing.T, urls ...string) *Client {
	t.Helper()
	c, err := Open(context.Background(), Options{URLs: urls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func serverBackend() backend {
	return backend{"server", func(t *testing.T) *Client { return openURLs(t, redistest.Shared(t).URL()) }}
}

func clusterBackend() backend {
	return backend{"cluster", func(t *testing.T) *Client { return openURLs(t, redistest.SharedCluster(t, 3).URLs()...) }}
}

func miniredisBackend() backend {
	return backend{"miniredis", func(t *testing.T) *Client {
		m := miniredis.RunT(t)
		m.ClockTTL(true) // expire keys by the wall clock, as an embedded server must
		c := openURLs(t, "redis://"+m.Addr())
		minis.Store(c, m)
		t.Cleanup(func() { minis.Delete(c) })
		return c
	}}
}

// minis maps the clients of miniredis backends to their servers, for clock control.
var minis sync.Map

// realBackends are a real server and a real cluster: the paths that can differ on a cluster.
func realBackends() []backend { return []backend{serverBackend(), clusterBackend()} }

// allBackends add miniredis, for the basic paths it supports.
func allBackends() []backend { return append(realBackends(), miniredisBackend()) }

// forEach runs f as a subtest per backend.
func forEach(t *testing.T, bs []backend, f func(t *testing.T, c *Client, k Keys)) {
	t.Helper()
	for _, b := range bs {
		t.Run(b.name, func(t *testing.T) {
			f(t, b.open(t), testKeys(t))
		})
	}
}

var nonKeyChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// runs makes prefixes unique across -count repetitions on a shared server.
var runs atomic.Int64

// testKeys returns a key layout with a prefix unique to the test (and to this run of it).
func testKeys(t *testing.T) Keys {
	name := strings.Trim(nonKeyChars.ReplaceAllString(t.Name(), "-"), "-")
	return Keys{Prefix: fmt.Sprintf("t%d:%s", runs.Add(1), name)}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or the deadline passes: for conditions that depend on
// Redis's clock (expiry, idle time), never as a fixed sleep.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// isMiniredis tells whether the client talks to miniredis (whose INFO lacks a server section).
func (c *Client) isMiniredis(t *testing.T) bool {
	t.Helper()
	info, err := c.Universal().Info(ctxT(t), "server").Result()
	return err != nil || !strings.Contains(info, "redis_version")
}

func ctxB(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	return ctx
}
