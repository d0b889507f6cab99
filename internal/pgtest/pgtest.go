// Package pgtest starts a private PostgreSQL server for a test, with wal_level = logical, for the
// postgres_cdc source's tests: the machine's server (internal/sqltest) does not have logical
// replication. Start runs initdb into a temporary directory and the server on a free loopback port,
// as the postgres OS user when the tests run as root (PostgreSQL refuses to run as root), and stops
// it and removes the directory when the test ends. Without initdb (Debian/Ubuntu: `apt-get install
// postgresql`), the test is skipped, unless FLOWRUN_REQUIRE_TOOLS is set (as in CI): then it fails.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// InstallHint says how to get the server's binaries.
const InstallHint = "the PostgreSQL server binaries (initdb, postgres) are not installed: " +
	"Debian/Ubuntu: `apt-get install postgresql`; or set PATH to include them"

// startTimeout bounds how long the server may take to accept connections.
const startTimeout = 60 * time.Second

// Server is a private PostgreSQL server.
type Server struct {
	Port int
	dir  string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
}

// DSN is the connection string of a database of the server, as the superuser postgres (which has
// the REPLICATION attribute), without a password (trust).
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=5", s.Port, database)
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// Log is what the server has logged so far.
func (s *Server) Log() string { return s.log.String() }

// Connect opens a connection to a database of the server; it is closed when the test ends.
func (s *Server) Connect(t testing.TB, database string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.DSN(database))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// Exec runs statements on a database of the server, failing the test on an error.
func (s *Server) Exec(t testing.TB, database string, statements ...string) {
	t.Helper()
	conn := s.Connect(t, database)
	for _, st := range statements {
		if _, err := conn.Exec(context.Background(), st); err != nil {
			t.Fatalf("pgtest: %s: %v", st, err)
		}
	}
}

// binDir finds the directory of initdb and postgres: on PATH, or the newest of Debian's
// /usr/lib/postgresql/<version>/bin.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	if len(found) == 0 {
		return "", errors.New(InstallHint)
	}
	return filepath.Dir(found[0]), nil
}

func version(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

// Start starts a server with wal_level = logical for the test.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		if os.Getenv("FLOWRUN_REQUIRE_TOOLS") != "" {
			t.Fatalf("pgtest: %v", err)
		}
		t.Skipf("pgtest: %v", err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: the tests run as root, and PostgreSQL does not: it runs as the postgres user, which is missing (%v)", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	for attempt := 0; ; attempt++ {
		s, err := launch(bin, dir, data, cred)
		if err == nil {
			t.Cleanup(s.stop)
			return s
		}
		if attempt == 3 {
			t.Fatalf("pgtest: %v", err)
		}
	}
}

func launch(bin, dir, data string, cred *syscall.Credential) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	s := &Server{Port: port, dir: dir, log: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "wal_level=logical", "-c", "max_replication_slots=20", "-c", "max_wal_senders=20",
		"-c", "max_connections=100", "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "shared_buffers=32MB")
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	// The kernel kills the server when the test binary dies (Go sets this after the credentials).
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("postgres exited at start:\n%s", s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("postgres did not accept connections within %s: %v\n%s", startTimeout, err, s.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop shuts the server down fast (SIGINT), or kills it.
func (s *Server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// syncBuffer is a buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
