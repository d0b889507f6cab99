package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flowrun/internal/redistest"
)

// The nats kinds' round trip through SIGKILLs of flowrun and a restart of NATS, on a NATS server of
// the test's own (the machine's, which others use, is never stopped).

// natsServer is a nats-server process of a test's own, with JetStream, on a free loopback port,
// storing its streams in a directory of the test's that outlives a restart.
type natsServer struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
	log  *syncBuffer
}

// startNATSServer starts a private nats-server (nats-server on the PATH, or /usr/sbin/nats-server),
// which the test's end stops.
func startNATSServer(t *testing.T) *natsServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &natsServer{t: t, port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(func() {
		if s.cmd != nil {
			s.stop()
		}
	})
	return s
}

// url is the server's URL.
func (s *natsServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// start starts the server, on its port and with its store, and waits until it takes connections.
func (s *natsServer) start() {
	s.t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
	}
	s.log = &syncBuffer{}
	s.cmd = exec.Command(bin, "-js", "-sd", s.dir, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port))
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	// The kernel kills it should the test binary die (a timeout, an interrupt), as pgtest's.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("this test needs nats-server (apt-get install nats-server): %v", err)
	}
	waitFor(s.t, "the private nats-server to take connections", func() bool {
		if s.cmd.ProcessState != nil {
			s.t.Fatalf("nats-server exited: %s", s.log.String())
		}
		nc, err := nats.Connect(s.url(), nats.Timeout(time.Second))
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		_, err = js.AccountInfo(context.Background())
		return err == nil
	})
}

// stop stops the server (SIGTERM: it shuts down, its store kept) and waits for it to be gone.
func (s *natsServer) stop() {
	s.t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		s.t.Logf("nats-server stopped (%v: its status on SIGTERM)", err)
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		s.t.Errorf("nats-server did not stop on SIGTERM in a minute (killed: %v): %s", <-done, s.log.String())
	}
	s.cmd = nil
}

// natsEach calls each with messages 1 to n of stream, in stream order, and their i.
func natsEach(t *testing.T, js jetstream.JetStream, stream string, n int, each func(m *jetstream.RawStreamMsg, i int)) {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= uint64(n); seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ I int }
		if err := json.Unmarshal(m.Data, &v); err != nil {
			t.Fatal(err)
		}
		each(m, v.I)
	}
}

// checkSubjectOrder checks that the n messages of stream are, on each subject, in the order of
// their i, which is the order they were published in; it returns how many subjects there are.
func checkSubjectOrder(t *testing.T, js jetstream.JetStream, stream string, n int) int {
	t.Helper()
	last, disorder := map[string]int{}, 0
	natsEach(t, js, stream, n, func(m *jetstream.RawStreamMsg, i int) {
		if prev, ok := last[m.Subject]; ok && i < prev {
			if disorder++; disorder <= 5 {
				t.Errorf("on %s, message %d after %d", m.Subject, i, prev)
			}
		}
		last[m.Subject] = i
	})
	if disorder > 0 {
		t.Errorf("%d messages out of their subject's order", disorder)
	}
	return len(last)
}

// natsRoundTripPipeline reads stream in into topic "in" (4 partitions, keyed by the subject),
// through a map that sets k (k<i%10>) and via, and, with filter, a filter that passes all (stage
// pass), and publishes to stream out with the nats sink, on out.out.<the subject's last part>. The
// pipeline block has attrs.
func natsRoundTripPipeline(attrs, url, in, out string, filter bool) string {
	last, pass := "mark", ""
	if filter {
		last, pass = "pass", `
stage "pass" {
  kind  = "filter"
  input = stage.mark
  where = msg.i >= 0
}`
	}
	return fmt.Sprintf(`
pipeline "natsroundtrip" {
  %[1]s
}
topic "in" {
  partitions = 4
}
source "jet" {
  kind     = "nats"
  url      = %[2]q
  stream   = %[3]q
  durable  = "flowrun"
  ack_wait = "2s"
  output   = topic.in
}
stage "mark" {
  kind  = "map"
  input = topic.in
  set   = { k = "k${msg.i %% 10}", via = "flowrun" }
}%[5]s
sink "jet_out" {
  kind    = "nats"
  input   = stage.%[6]s
  url     = %[2]q
  subject = "%[4]s.out.${trimprefix(key, "%[3]s.")}"
  timeout = "2s"
}
`, attrs, url, in, out, pass, last)
}

// natsPublishPaced publishes messages [0, n) to stream as natsPublish does, one at a time and in
// order, each with a Nats-Msg-Id of its own, never more than backlog ahead of what stored says
// is out, and counts them in published. A publication that fails (NATS away) is made again until
// JetStream confirms it: the Nats-Msg-Id has it stored once.
func natsPublishPaced(js jetstream.JetStream, stream string, n, backlog int, published *atomic.Int64, stored func() int64) error {
	deadline := time.Now().Add(10 * time.Minute) // only keeps a broken test from hanging
	for i := 0; i < n; i++ {
		for int64(i)-stored() >= int64(backlog) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the output stream stopped at %d messages while %d were published", stored(), i)
			}
			time.Sleep(5 * time.Millisecond)
		}
		m := nats.NewMsg(fmt.Sprintf("%s.k%d", stream, i%10))
		m.Data = fmt.Appendf(nil, `{"i":%d}`, i)
		m.Header.Set("origin", "test")
		if i%10 == 0 {
			m.Header.Set("traceparent", natsTraceparent(i))
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(fmt.Sprintf("test-%d", i)))
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("publishing message %d: %w", i, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		published.Store(int64(i + 1))
	}
	return nil
}

// natsRoundTripSize is how many messages the round trip sends.
func natsRoundTripSize() int {
	if *soakFlag {
		return 100000
	}
	return 4000
}

// TestNATSRoundTripThroughKillsAndARestart: messages published by the test's NATS client to a
// JetStream stream go in through the nats source, through a map and a filter that passes all, out
// through the nats sink to another stream, with delivery = "effectively_once", in flowrun processes
// the test SIGKILLs twice after random progress; in between, under the second process, it stops its
// private nats-server and starts it again on the same store. A last process runs until JetStream
// has every message acknowledged and the sink every entry: each message is once in the topic and
// once in the output stream (read back with the test's client), on its subject's counterpart, with
// its headers and trace context, and each subject's messages in the order they were published.
// 4,000 messages; with -soak, 100,000.
func TestNATSRoundTripThroughKillsAndARestart(t *testing.T) {
	t.Parallel()
	n := natsRoundTripSize()
	ns := startNATSServer(t)
	nc, err := nats.Connect(ns.url(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	in, out := "RTIN", "RTOUT"
	for _, name := range []string{in, out} {
		// On disk, to outlive the restart; the duplicate window is JetStream's default (2 minutes).
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}); err != nil {
			t.Fatal(err)
		}
	}
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("natsroundtrip-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "roundtrip.hcl")
	writeFile(t, path, natsRoundTripPipeline(fmt.Sprintf("key_prefix = %q\n  delivery   = \"effectively_once\"", prefix), ns.url(), in, out, true))
	// stored is how many messages the output stream has; -1 while NATS does not answer.
	stored := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, out)
		if err != nil {
			return -1
		}
		info, err := s.Info(ctx)
		if err != nil {
			return -1
		}
		return int64(info.State.Msgs)
	}
	// progress waits for the output stream to hold least messages, as long as it grows: beside the
	// other connectors' proofs on a loaded machine, a fixed minute was not always enough.
	progress := func(p *process, what string, least int64) {
		t.Helper()
		if !waitProgress(t, what, least, func() int64 {
			if p.cmd.ProcessState != nil {
				t.Fatalf("the flowrun process exited: %s", p.log.String())
			}
			return stored()
		}) {
			t.FailNow()
		}
	}
	// The test's client publishes the messages as the run goes on, in order, a backlog of at
	// most a tenth of them ahead of the output stream, so that the kills and the restart find the
	// source with messages delivered and not yet in Redis; it waits out the restart, publishing
	// the same message again until JetStream confirms it (with a Nats-Msg-Id of its own, which
	// JetStream stores once should a confirmation be lost).
	var published atomic.Int64
	pubDone := make(chan error, 1)
	go func() { pubDone <- natsPublishPaced(js, in, n, n/10, &published, stored) }()
	bin := flowrunBinary(t)
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "300ms"}
	// at is a random point between a tenth and a quarter of the messages past from tenths.
	at := func(from int) int64 { return int64(from*n/10 + n/10 + rand.IntN(n*15/100)) }
	var logs []string

	first := startBinary(t, bin, args...)
	progress(first, "the first process's progress", at(0))
	first.kill(t)
	logs = append(logs, first.log.String())

	second := startBinary(t, bin, args...)
	progress(second, "the second process's progress", at(3))
	before := stored()
	ns.stop()
	// The server starts again once the process has found it away: its source and sink say so.
	for deadline := time.Now().Add(time.Minute); strings.Count(second.log.String(), "nats: disconnected") < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the second process said nothing of NATS away in a minute:\n%s", second.log.String())
		}
	}
	ns.start()
	progress(second, "the second process's progress after the restart", at(5))
	second.kill(t)
	logs = append(logs, second.log.String())

	last := startBinary(t, bin, args...)
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every message in the output stream", func() bool { return stored() == int64(n) })
	waitFor(t, "JetStream to have every message acknowledged, and the sink every entry", func() bool {
		cons, err := js.Consumer(context.Background(), in, "flowrun")
		if err != nil {
			return false
		}
		info, err := cons.Info(context.Background())
		if err != nil {
			return false
		}
		return info.NumAckPending == 0 && info.NumPending == 0 && acked(t, c, prefix, "pass.out", 4, "jet_out") == int64(n)
	})
	last.kill(t)
	logs = append(logs, last.log.String())

	checkEachOnce(t, natsTopic(t, c, prefix, in), n)
	checkEachOnce(t, natsStored(t, js, out), n)
	// Each subject's messages in the order they were published (i ascending: natsPublish publishes
	// i on subject k<i%10> in order).
	subjects := checkSubjectOrder(t, js, out, n)
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	all := strings.Join(logs, "")
	t.Logf("%d messages through 2 SIGKILLs and a restart of NATS (at %d messages out): each once in the topic and in the output stream, in order on each of %d subjects; "+
		"the source held its messages back %d times and released them %d times; %d leases lost",
		n, before, subjects, strings.Count(all, "nats: holding the messages back"), strings.Count(all, "nats: passing on the messages held back, in stream order"), leaseLosses(logs...))
}
