package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a server may take to answer PING after it was started (this
// includes replaying an AOF file on Restart).
const startTimeout = 20 * time.Second

// stopTimeout bounds how long Stop waits for a SIGTERM'd server before it sends SIGKILL.
const stopTimeout = 10 * time.Second

// probeTimeout bounds one PING probe while waiting for a server to come up.
const probeTimeout = 500 * time.Millisecond

// portAttempts is how many free-port candidates Start tries before it gives up.
const portAttempts = 5

// InstallHint tells a developer how to get redis-server when it is missing.
const InstallHint = "redis-server is not on PATH: install it (Debian/Ubuntu: `apt-get install redis-server`; " +
	"macOS: `brew install redis`) or run `make test`, which installs it"

// Option configures a server started by Start or StartCluster.
type Option func(*config)

type config struct {
	aof     bool
	cluster bool
	tls     bool
	// tlsClientAuth makes the TLS port require a client certificate.
	tlsClientAuth bool
	// tlsFiles are the certificates of a cluster's nodes, which share one CA; nil: the server
	// generates its own.
	tlsFiles *tlsFiles
	args     []string
}

// WithAOF turns on the append-only file with `appendfsync always`, so that every acknowledged
// write survives Restart and Kill.
func WithAOF() Option { return func(c *config) { c.aof = true } }

// WithArgs appends raw redis-server arguments, for example WithArgs("--maxmemory", "2mb").
// They come last, so they override the harness's defaults.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// Server is one redis-server process listening on a loopback port. Its methods are safe for
// concurrent use.
type Server struct {
	bin     string
	dir     string
	port    int
	busPort int // cluster bus port; 0 when not a cluster node
	tlsPort int // TLS port; 0 without WithTLS
	tls     *tlsFiles
	cfg     config
	ownsDir bool

	mu   sync.Mutex
	proc *process
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // the Wait error, valid after done
}

// Start runs redis-server on a free loopback port with its own temporary directory and stops it
// when the test (or benchmark) ends. By default it persists nothing (`--save "" --appendonly no`);
// see WithAOF. It fails the test when redis-server is not installed (see InstallHint).
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := startServer(opts...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { s.shutdown() })
	return s
}

// startServer starts a server without a testing.TB; the caller must call shutdown.
func startServer(opts ...Option) (*Server, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New(InstallHint)
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("creating data directory: %w", err)
	}
	s := &Server{bin: bin, dir: dir, cfg: cfg, ownsDir: true}
	if cfg.tls && cfg.tlsFiles != nil {
		s.tls = cfg.tlsFiles
	} else if cfg.tls {
		if s.tls, err = writeTLSFiles(dir); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("generating TLS certificates: %w", err)
		}
	}
	var lastErr error
	for range portAttempts {
		ports, err := freePorts(1 + boolInt(cfg.cluster) + boolInt(cfg.tls))
		if err != nil {
			lastErr = err
			continue
		}
		s.port, ports = ports[0], ports[1:]
		if cfg.cluster {
			s.busPort, ports = ports[0], ports[1:]
		}
		if cfg.tls {
			s.tlsPort = ports[0]
		}
		err = s.launch()
		if err == nil {
			return s, nil
		}
		lastErr = err
		if !errors.Is(err, errPortInUse) {
			break
		}
		// Another process took the port between our probe and redis-server's bind: pick again.
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

var errPortInUse = errors.New("port already in use")

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// freePorts asks the kernel for n distinct free loopback ports. The listeners are closed before
// returning, so another process may take a port before redis-server binds it; launch detects that
// and startServer retries.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

func (s *Server) args() []string {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", s.logPath(),
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
	}
	if s.cfg.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	if s.cfg.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(s.busPort),
			"--cluster-node-timeout", "5000",
		)
	}
	if s.tls != nil {
		args = append(args,
			"--tls-port", strconv.Itoa(s.tlsPort),
			"--tls-cert-file", s.tls.cert,
			"--tls-key-file", s.tls.key,
			"--tls-ca-cert-file", s.tls.ca,
			"--tls-auth-clients", map[bool]string{false: "no", true: "yes"}[s.cfg.tlsClientAuth],
		)
		if s.cfg.cluster {
			// The cluster bus speaks TLS too, and CLUSTER SLOTS answers a TLS client with the
			// nodes' TLS ports (a plain one, such as the harness's, with their plain ports).
			args = append(args, "--tls-cluster", "yes", "--tls-replication", "yes")
		}
	}
	return append(args, s.cfg.args...)
}

// launch starts the process on s.port and waits until it answers PING.
func (s *Server) launch() error {
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	backoff := time.Millisecond
	for {
		err := ping(s.Addr(), probeTimeout)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			log := s.logTail()
			if strings.Contains(log, "Address already in use") {
				return fmt.Errorf("redis-server on port %d: %w", s.port, errPortInUse)
			}
			return fmt.Errorf("redis-server on port %d exited before answering PING (%v); log:\n%s", s.port, p.err, log)
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on port %d did not answer PING within %s (last error: %v); log:\n%s",
				s.port, startTimeout, err, s.logTail())
		}
		// Wait for the process to exit or for the next probe, whichever comes first.
		select {
		case <-p.done:
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 50*time.Millisecond)
	}
}

// ping sends a RESP PING and expects +PONG. A server still loading its AOF answers -LOADING,
// which counts as not ready.
func ping(addr string, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }() // a probe: its answer is read already, or the error returned
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("unexpected PING reply %q", strings.TrimSpace(line))
	}
	return nil
}

// logTail returns the last lines of the server's log file, for error messages.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// Addr returns host:port, for example "127.0.0.1:40123".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL returns the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Dir returns the server's data directory (AOF files and the log live there).
func (s *Server) Dir() string { return s.dir }

// Pid returns the process id of the running redis-server, or 0 when it is stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Client returns a go-redis client for the server that is closed when the test ends.
func (s *Server) Client(t testing.TB) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop shuts the server down with SIGTERM (SIGKILL after a timeout) and waits for it to exit.
// Without AOF its data is gone; with WithAOF, Restart brings it back.
func (s *Server) Stop() {
	s.signal(syscall.SIGTERM)
}

// Kill sends SIGKILL and waits for the process to exit, like a crash.
func (s *Server) Kill() {
	s.signal(syscall.SIGKILL)
}

func (s *Server) kill() { s.signal(syscall.SIGKILL) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Restart stops the server (if it runs) and starts it again on the same port and directory,
// keeping the AOF data when WithAOF was given. It fails the test if the server does not come
// back.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.launch(); err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
}

// Start starts a stopped or killed server again on the same port and directory.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if s.Pid() != 0 {
		t.Fatalf("redistest: server on %s is already running", s.Addr())
	}
	if err := s.launch(); err != nil {
		t.Fatalf("redistest: start: %v", err)
	}
}

// shutdown stops the server and removes its directory.
func (s *Server) shutdown() {
	s.Kill()
	if s.ownsDir {
		_ = os.RemoveAll(s.dir)
	}
}

// Do sends one command to the server on a short-lived connection, for harness internals.
func (s *Server) do(ctx context.Context, args ...any) (any, error) {
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), MaxRetries: -1, Protocol: 2})
	defer func() { _ = c.Close() }() // one command, answered before the client closes
	return c.Do(ctx, args...).Result()
}
