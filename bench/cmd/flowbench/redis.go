package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// redisServer is the private redis-server the benchmark runs against: a free loopback port, its
// own directory, no persistence. It is never the Redis a developer may run on 6379.
type redisServer struct {
	cmd  *exec.Cmd
	port int
	dir  string
	done chan struct{}
}

// startRedis launches redis-server and waits until it answers PING.
func startRedis() (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server is not on PATH (Debian/Ubuntu: apt-get install redis-server)")
	}
	dir, err := os.MkdirTemp("", "flowbench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		s := &redisServer{port: port, dir: dir, done: make(chan struct{})}
		s.cmd = exec.Command(bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no",
			"--dir", dir, "--daemonize", "no",
			"--loglevel", "warning", "--logfile", filepath.Join(dir, "redis.log"))
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		go func() { _ = s.cmd.Wait(); close(s.done) }()
		if err := s.waitUp(10 * time.Second); err != nil {
			lastErr = err
			s.kill()
			continue // most likely someone took the port between the probe and the bind
		}
		return s, nil
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("starting redis-server: %w", lastErr)
}

// freePort returns a loopback TCP port that was free a moment ago, never 6379.
func freePort() (int, error) {
	for range 10 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port != 6379 {
			return port, nil
		}
	}
	return 0, errors.New("no free port")
}

// cpu returns the CPU time the server has used so far.
func (s *redisServer) cpu() (time.Duration, error) { return procCPU(s.cmd.Process.Pid) }

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }
func (s *redisServer) url() string  { return "redis://" + s.addr() }

func (s *redisServer) waitUp(timeout time.Duration) error {
	rdb := goredis.NewClient(&goredis.Options{Addr: s.addr(), DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer func() { _ = rdb.Close() }() // a probe: it writes nothing
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server exited: %s", strings.TrimSpace(string(log)))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %d did not answer: %w", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop terminates the server and removes its directory.
func (s *redisServer) stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}

// kill terminates the server (SIGTERM, then SIGKILL after 5s) and waits for it.
func (s *redisServer) kill() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// version returns the server's redis_version.
func redisVersion(ctx context.Context, rdb *goredis.Client) string {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "unknown"
}
