package redis

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
)

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// go-redis prints some failures on standard error by itself, which would repeat flowrun's own
// error message. The test runs its failing half in a child process, whose standard error it reads.
func TestGoRedisPrintsNothing(t *testing.T) {
	const env = "FLOWRUN_TEST_GOREDIS_LOG_CHILD"
	if os.Getenv(env) != "" {
		goRedisFailures(t)
		return
	}
	// The deadline only keeps a regression from hanging the test: the child is killed, and its
	// output shown.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestGoRedisPrintsNothing$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("still running after 2 minutes, killed (%w)", err)
		}
		t.Fatalf("child: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if !bytes.Contains(stdout.Bytes(), []byte("--- PASS: TestGoRedisPrintsNothing")) {
		t.Fatalf("the child did not run the test:\n%s", stdout.String())
	}
	if stderr.Len() != 0 {
		t.Fatalf("go-redis printed on standard error:\n%s", stderr.String())
	}
}

// goRedisFailures makes go-redis fail in the ways that it logs: dialling a dead address (single
// server and cluster seeds), and re-dialling a server that died after Open.
func goRedisFailures(t *testing.T) {
	ctx := context.Background()
	dead := "redis://" + closedAddr(t)
	for _, urls := range [][]string{{dead}, {dead, "redis://" + closedAddr(t)}} {
		if c, err := Open(ctx, Options{URLs: urls}); err == nil {
			_ = c.Close()
			t.Fatalf("Open(%v) succeeded", urls)
		}
	}
	srv := redistest.Start(t)
	c := openURLs(t, srv.URL())
	srv.Kill()
	// The pooled connection is broken and a new one cannot be dialled.
	for range 2 {
		if err := c.rdb.Ping(ctx).Err(); err == nil {
			t.Fatal("a call to a killed server succeeded")
		}
	}
}
