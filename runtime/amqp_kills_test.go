package runtime_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/internal/sqltest"
)

// The amqp kinds through SIGKILLs of the flowrun process, and of the broker: the source, with
// effectively-once delivery, writes each message once though the broker delivers again what a
// killed process had not acknowledged (each message has a message_id); the sink publishes every
// entry, a message published again carrying the message_id of its first publication.

// amqpKillCycles is how many flowrun processes each test kills, and how many messages it sends.
func amqpKillCycles(soak int) (kills, n int) {
	if *soakFlag {
		return 2, soak
	}
	return 2, 3000
}

// TestAMQPSourceThroughKills publishes messages to a queue while flowrun processes read it into
// the topic with effectively-once delivery, and SIGKILLs each after random progress; a last
// process runs until everything is there: each message once, keyed by its routing key and in its
// order on it, and the queue empty.
func TestAMQPSourceThroughKills(t *testing.T) {
	t.Parallel()
	kills, n := amqpKillCycles(100000)
	kills++
	name := amqpName(t)
	amqpQueue(t, amqpURL(), name, nil)
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("amqpkill-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "amqp.hcl")
	writeFile(t, path, amqpSourcePipeline(prefix, "effectively_once", amqpURL(), name))
	done := make(chan struct{})
	go func() { // the publisher goes on through the kills, a slice at a time
		defer close(done)
		ch := amqpClient(t, amqpURL())
		for from := 0; from < n; from += 500 {
			amqpPublish(t, ch, name, from, min(from+500, n), true)
		}
	}()
	bin := flowrunBinary(t)
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "300ms"}
	var logs []string
	for cycle := 0; cycle < kills; cycle++ {
		before := amqpEntries(t, c, prefix)
		p := startBinary(t, bin, args...)
		progress := int64(300 + rand.IntN(2000))
		waitFor(t, fmt.Sprintf("cycle %d: %d entries more", cycle, progress), func() bool {
			e := amqpEntries(t, c, prefix)
			return e-before >= progress || e >= int64(n)
		})
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	<-done
	// The last process takes what the broker delivers again and then 100 messages more, published
	// once it runs: the last of them written, the source has passed on every message before them,
	// and stopping acknowledges them all.
	last := startBinary(t, bin, args...)
	amqpPublish(t, amqpClient(t, amqpURL()), name, n, n+100, true)
	n += 100
	waitFor(t, "every message in the topic", func() bool { return amqpEntries(t, c, prefix) >= int64(n) })
	stopGracefully(t, last)
	logs = append(logs, last.log.String())
	checkEachOnce(t, amqpTopic(t, c, prefix, name), n)
	if d := amqpDepth(t, amqpURL(), name); d != 0 {
		t.Errorf("the queue holds %d messages after the last process stopped", d)
	}
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	t.Logf("%d messages published while %d processes were SIGKILLed: each once in the topic, in each routing key's order; %d leases lost",
		n, kills, leaseLosses(logs...))
}

// rabbitNode is a RabbitMQ node of the test's own (rabbitmq-server), on free loopback ports, with
// its data in a temporary directory, so that the test can kill and restart it.
type rabbitNode struct {
	dir, name string
	port      int
	mgmtPort  int // the management plugin's HTTP port; 0 when it is off
	cmd       *exec.Cmd
}

// startRabbitNode starts a node of the test's own, or returns nil (and says why) when
// rabbitmq-server cannot run here; it is killed when the test ends.
func startRabbitNode(t *testing.T) *rabbitNode { return startRabbitNodeWith(t, false) }

// startRabbitNodeWith is startRabbitNode, with the management plugin (which rabbitmqadmin talks
// to) on a free loopback port when management is set.
func startRabbitNodeWith(t *testing.T, management bool) *rabbitNode {
	t.Helper()
	bin := "/usr/lib/rabbitmq/bin/rabbitmq-server" // not /usr/sbin's wrapper, which runs it as the rabbitmq user
	if _, err := os.Stat(bin); err != nil {
		t.Logf("no rabbitmq-server (%v): the broker is cut off by a proxy instead", err)
		return nil
	}
	dir, err := os.MkdirTemp("", "flowrun-rabbit-")
	if err != nil {
		t.Fatal(err)
	}
	n := &rabbitNode{dir: dir, name: fmt.Sprintf("flowrun%d_%d@localhost", os.Getpid(), prefixes.Add(1)), port: freePort(t)}
	conf, plugins := fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\n", n.port), "[].\n"
	if management {
		n.mgmtPort = freePort(t)
		conf += fmt.Sprintf("management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %d\n", n.mgmtPort)
		plugins = "[rabbitmq_management].\n"
	}
	writeFile(t, filepath.Join(dir, "rabbitmq.conf"), conf)
	writeFile(t, filepath.Join(dir, "enabled_plugins"), plugins)
	t.Cleanup(func() {
		n.kill()
		_ = os.RemoveAll(dir)
	})
	if err := n.start(t); err != nil {
		t.Logf("rabbitmq-server does not start here (%v): the broker is cut off by a proxy instead", err)
		return nil
	}
	return n
}

// start starts the node on its data, and waits for it to take connections.
func (n *rabbitNode) start(t *testing.T) error {
	t.Helper()
	cmd := exec.Command("/usr/lib/rabbitmq/bin/rabbitmq-server")
	n.cmd = cmd
	cmd.Env = append(os.Environ(), "RABBITMQ_NODENAME="+n.name, "RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(freePort(t)), "RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbitmq.conf"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.dir, "enabled_plugins"), "RABBITMQ_PID_FILE="+filepath.Join(n.dir, "pid"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, err := os.Create(filepath.Join(n.dir, "out.log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait(); _ = log.Close() }() // this start's process: a restart makes another
	deadline := time.Now().Add(90 * time.Second)
	for {
		if conn, err := net.Dial("tcp", n.addr()); err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(n.dir, "out.log"))
			n.kill()
			return fmt.Errorf("not up in 90s: %s", out)
		}
		time.Sleep(100 * time.Millisecond) // polling a port that is not open yet
	}
}

// kill SIGKILLs the node's processes (the script and its Erlang VM, whose pid the pid file has).
func (n *rabbitNode) kill() {
	if raw, err := os.ReadFile(filepath.Join(n.dir, "pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = os.Remove(filepath.Join(n.dir, "pid"))
	}
	if n.cmd != nil && n.cmd.Process != nil {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		conn, err := net.Dial("tcp", n.addr())
		if err != nil {
			return
		}
		_ = conn.Close()
	}
}

func (n *rabbitNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }
func (n *rabbitNode) url() string  { return "amqp://guest:guest@" + n.addr() + "/" }

// freePort is a loopback port free for now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestAMQPRoundTripThroughKillsAndARestart is the amqp kinds' round trip: messages published to
// a queue (with message_ids) go through the source, two stages and the sink to another queue,
// with effectively-once delivery, while two flowrun processes are SIGKILLed mid-stream and the
// broker is restarted once (with -soak, a RabbitMQ node of the test's own, SIGKILLed and started
// again on its data; in make test, and where rabbitmq-server cannot run, the machine's broker cut
// off by a proxy and let back: a node of its own takes a minute to boot twice under -race).
// Every message reaches the out queue; its copies (published again after a kill or the restart,
// before the broker confirmed them) carry one message_id, which a consumer that drops repeats (an
// amqp source with effectively-once) takes once: so counted, each message is there once, and each
// routing key's messages are in their order.
func TestAMQPRoundTripThroughKillsAndARestart(t *testing.T) {
	t.Parallel()
	kills, n := amqpKillCycles(100000)
	var url string
	var restart func()
	var node *rabbitNode
	if *soakFlag {
		node = startRabbitNode(t)
	}
	if node != nil {
		url = node.url()
		restart = func() {
			node.kill()
			if err := node.start(t); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		proxy := sqltest.NewProxy(t, amqpHost())
		url = amqpVia(proxy.Addr())
		restart = func() {
			proxy.Cut()
			waitFor(t, "the processes to try the broker while it is away", func() bool { return proxy.Refused() >= 3 })
			proxy.Restore()
		}
	}
	in, out := amqpName(t), amqpName(t)
	amqpQueue(t, url, in, nil)
	amqpQueue(t, url, out, nil)
	ch := amqpClient(t, url)
	for from := 0; from < n; from += 5000 {
		amqpPublish(t, ch, in, from, min(from+5000, n), true)
	}
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("amqproundtrip-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "amqp.hcl")
	writeFile(t, path, amqpRoundTrip(prefix, "effectively_once", url, in, out))
	bin := flowrunBinary(t)
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "300ms"}
	// Progress is what the sink has delivered and acknowledged (each message once), up to all of
	// them: a process runs on between the check and its kill, so the processes before the last
	// may leave fewer than a step, or none.
	sunk := func() int64 { return acked(t, c, prefix, "check.out", 4, "rabbit_out") }
	progressed := func(before int64, more int) bool { return sunk() >= min(before+int64(more), int64(n)) }
	var logs []string
	step := n / (kills + 3)
	for cycle := 0; cycle < kills; cycle++ {
		before := sunk()
		p := startBinary(t, bin, args...)
		t.Cleanup(func() {
			if t.Failed() { // a cycle that made no progress: what its process did
				t.Logf("the process of cycle %d:\n%s", cycle, p.log.String())
			}
		})
		progress := step/2 + rand.IntN(step)
		waitFor(t, fmt.Sprintf("cycle %d: %d messages more through the sink", cycle, progress), func() bool { return progressed(before, progress) })
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	before := sunk()
	last := startBinary(t, bin, args...)
	t.Cleanup(func() {
		if t.Failed() {
			l := last.log.String()
			t.Logf("the last process: %d messages through the sink when it started, %d now; %d entries in topic in; its log ends:\n%s",
				before, sunk(), amqpEntries(t, c, prefix), l[max(0, len(l)-4000):])
		}
	})
	waitFor(t, "progress before the broker's restart", func() bool { return progressed(before, step/2) })
	restart()
	if !waitProgress(t, "every message through the sink", int64(n), sunk) {
		if d := os.Getenv("FLOWRUN_AMQP_DEBUG"); d != "" {
			_ = last.cmd.Process.Signal(syscall.SIGQUIT)
			_ = waitProcess(t, last)
			_ = os.WriteFile(d, []byte(last.log.String()), 0o644)
		}
		l := last.log.String()
		t.Fatalf("%d entries in topic in; the last process's log ends:\n%s", amqpEntries(t, c, prefix), l[max(0, len(l)-4000):])
	}
	stopGracefully(t, last)
	logs = append(logs, last.log.String())
	got := amqpTake(t, url, out)
	checkEachOnce(t, amqpDistinct(t, got), n)
	keys := checkKeyOrder(t, got, func(m amqpOut) bool { return m.Key == out+".out.k"+strconv.Itoa(m.I%10) })
	if e := amqpEntries(t, c, prefix); e != int64(n) {
		t.Errorf("%d entries in topic in, want %d: effectively-once writes each message once", e, n)
	}
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	t.Logf("%d messages through %d SIGKILLs and a broker restart: %d entries in topic in; %d in the out queue, each once by message_id, in order on %d routing keys; %d leases lost",
		n, kills, amqpEntries(t, c, prefix), len(got), keys, leaseLosses(logs...))
}

// stopGracefully stops a flowrun process with SIGTERM, and waits for it to exit.
func stopGracefully(t *testing.T, p *process) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitProcess(t, p); err != nil {
		t.Errorf("the last process: %v\n%s", err, p.log.String())
	}
}
