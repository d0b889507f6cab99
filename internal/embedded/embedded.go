// Package embedded runs an in-memory Redis inside the flowrun process. It is the default of
// `flowrun run` when no Redis is configured (neither --redis nor FLOWRUN_REDIS_URL), so that a
// pipeline can be tried without installing anything: the process starts a miniredis
// (github.com/alicebob/miniredis/v2) on a free loopback port and talks to it over the Redis
// protocol like it would to a real server, through transport/redis.
//
// Keys with a time to live (leases, dedup markers) expire by the wall clock, as on a real
// server; miniredis's default is to expire them only when told to. A server started with StartAt
// follows a virtual clock instead (`flowrun test`): its TIME, entry IDs, idle times and TTLs move
// only when SetTime moves them.
//
// What it deliberately does not do:
//
//   - Persist anything. Every stream, group, lease and dead letter is gone when the process
//     exits (or Close is called); nothing is written to disk.
//   - Accept connections from other machines: it listens on 127.0.0.1 only. It has no
//     password, so any process on the same machine can connect while it runs (which is what
//     lets `redis-cli -p PORT` look inside during a demo).
//   - Behave exactly like Redis 7. miniredis lacks XAUTOCLAIM's deleted IDs (a pending entry
//     trimmed from its stream silently disappears instead of being dead-lettered), reports the
//     stream length as a group's lag, has no INFO cluster or server section, and increments the
//     delivery count on XCLAIM ... JUSTID. transport/redis's TestMiniredisGaps pins these
//     differences and docs/redis-keys.md lists them. Production pipelines use a real Redis.
//   - Scale: it is single-threaded behind one lock and keeps everything in Go's heap.
package embedded

import (
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Server is a running embedded Redis.
type Server struct {
	m    *miniredis.Miniredis
	addr string // kept: miniredis cannot tell its address once closed
}

// Start starts an embedded Redis on a free port of 127.0.0.1. Close stops it.
func Start() (*Server, error) { return startServer(time.Time{}) }

// StartAt starts an embedded Redis like Start, whose time stands at now until SetTime moves it.
func StartAt(now time.Time) (*Server, error) { return startServer(now) }

func startServer(now time.Time) (*Server, error) {
	m := miniredis.NewMiniRedis()
	if !now.IsZero() {
		m.SetTime(now) // before ClockTTL, which counts TTLs from the time it is enabled at
	}
	m.ClockTTL(true) // leases and dedup markers expire as the clock moves, as on a real server
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("starting the embedded Redis: %w", err)
	}
	return &Server{m: m, addr: m.Addr()}, nil
}

// SetTime moves the time of a server started with StartAt: keys whose time to live has passed
// expire, and new entry IDs, idle times and TIME take the new time.
func (s *Server) SetTime(t time.Time) { s.m.SetTime(t) }

// CommandCount returns the number of commands the server has processed: a test that waits for a
// pipeline to be idle watches it stand still.
func (s *Server) CommandCount() int { return s.m.CommandCount() }

// Addr returns the "127.0.0.1:port" the server listens on.
func (s *Server) Addr() string { return s.addr }

// URL returns the server's URL, "redis://127.0.0.1:port", for transport/redis.Open.
func (s *Server) URL() string { return "redis://" + s.addr }

// Close stops the server and drops its data. Connections still open fail. It is safe to call
// more than once.
func (s *Server) Close() { s.m.Close() }
