package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The NATS scenarios of issue 25, on a nats-server of the harness's own (JetStream, file storage,
// a free loopback port; started at first use, stopped at the end), never the machine's:
//
//   - NATS-IN: a JetStream stream filled beforehand with the harness's messages on 4 subjects, read
//     by flowrun's nats source into a topic of 4 partitions, and by Benthos's nats_jetstream input
//     into a redis_streams output (messages/s, from the warm-up's last to the last).
//   - NATS-OUT: a stream of Redis filled beforehand, published to JetStream by flowrun's nats sink
//     and by Benthos's nats_jetstream output, each waiting for JetStream's acknowledgement
//     (messages/s, until the stream holds every one).

const (
	kindNATSIn kind = iota + 500
	kindNATSOut
	natsInStream     = "FBIN"
	natsOutStream    = "FBOUT"
	benthosNATSInput = benthosStreamNS + ":{natsin}"
)

var natsScenarios = []scenario{
	{name: "NATS-IN", kind: kindNATSIn, impl: implFlowrun, vs: "Benthos NATS-IN", pipeline: "nats-in"},
	{name: "Benthos NATS-IN", kind: kindNATSIn, impl: implBenthos},
	{name: "NATS-OUT", kind: kindNATSOut, impl: implFlowrun, stages: 1, vs: "Benthos NATS-OUT", pipeline: "nats-out"},
	{name: "Benthos NATS-OUT", kind: kindNATSOut, impl: implBenthos, stages: 1},
}

func init() {
	scenarios = append(scenarios, natsScenarios...)
	benchPipelines = append(benchPipelines,
		benchPipeline{name: "nats-in", src: natsInHCL},
		benchPipeline{name: "nats-out", src: natsOutHCL},
	)
}

const natsInHCL = `# Written by flowbench: a JetStream stream into a topic of 4 partitions.
pipeline "bench" {
  key_prefix = "fb"
}
variable "url" { default = "nats://127.0.0.1:4222" } # the harness sets its server
source "jet" {
  kind    = "nats"
  url     = var.url
  stream  = "FBIN"
  durable = "flowbench"
  output  = topic.in
}
topic "in" { partitions = 4 }
`

const natsOutHCL = `# Written by flowbench: a topic of 4 partitions published to JetStream.
pipeline "bench" {
  key_prefix = "fb"
}
variable "url" { default = "nats://127.0.0.1:4222" } # the harness sets its server
topic "in" {
  partitions = 4
  key        = msg.key
}
sink "jet" {
  kind    = "nats"
  input   = topic.in
  url     = var.url
  subject = "fbout.${msg.key}"
}
`

// benchNATS is the harness's nats-server.
type benchNATS struct {
	url string
	js  jetstream.JetStream
}

// natsServer starts the harness's nats-server at first use.
func (h *harness) natsServer() (*benchNATS, error) {
	if h.nats != nil {
		return h.nats, nil
	}
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(h.tmp, "nats-")
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-js", "-sd", filepath.Join(dir, "store"), "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("a nats-server of the harness's own (%s): %w", bin, err)
	}
	h.cleanups = append(h.cleanups, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = log.Close()
	})
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		nc, err := nats.Connect(url)
		if err == nil {
			h.cleanups = append(h.cleanups, nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				return nil, err
			}
			if _, err = js.AccountInfo(context.Background()); err == nil {
				h.nats = &benchNATS{url: url, js: js}
				return h.nats, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the harness's nats-server at %s did not answer within 30s: %v", url, err)
		}
	}
}

// natsStreamAfresh deletes stream (and its consumers) and creates it again, empty, on disk.
func natsStreamAfresh(ctx context.Context, js jetstream.JetStream, name, subjects string) error {
	if err := js.DeleteStream(ctx, name); err != nil && !strings.Contains(err.Error(), "not found") {
		return err
	}
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subjects}, Storage: jetstream.FileStorage})
	return err
}

// natsRun dispatches a scenario of this file (see harness.run).
func (h *harness) natsRun(ctx context.Context, sc scenario) result {
	srv, err := h.natsServer()
	if err != nil {
		return result{failed: err.Error()}
	}
	if sc.kind == kindNATSIn {
		return h.runNATSIn(ctx, sc, srv)
	}
	return h.runNATSOut(ctx, sc, srv)
}

// runNATSIn fills the input stream with cfg.warm + cfg.flat/2 messages, starts the system, and
// times the flat part from the moment the warm-up's messages are in Redis until the last one is.
func (h *harness) runNATSIn(ctx context.Context, sc scenario, srv *benchNATS) (res result) {
	if err := natsStreamAfresh(ctx, srv.js, natsInStream, "fbin.>"); err != nil {
		return result{failed: err.Error()}
	}
	warm, flat := h.cfg.warm, h.cfg.flat/2
	p := make([]byte, payloadSize)
	for i := range warm + flat {
		putPayload(p, time.Now().UnixNano(), phaseConn, i)
		if _, err := srv.js.PublishAsync(fmt.Sprintf("fbin.k%d", i%4), append([]byte(nil), p...)); err != nil {
			return result{failed: err.Error()}
		}
		if i%4096 == 4095 {
			<-srv.js.PublishAsyncComplete()
		}
	}
	<-srv.js.PublishAsyncComplete()
	var c *child
	var err error
	streams := []string{benthosNATSInput}
	if sc.impl == implBenthos {
		logPath := h.logPath(sc)
		c, err = h.startBenthosConfig(sc, logPath, benthosNATSInConfig(h.srv.addr(), srv.url, logPath), false)
	} else {
		streams = strings.Split(partitionStreams("in", 4), partSep)
		c, err = startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(), "--var", "url="+srv.url)
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	entries := func() (int, error) {
		n := 0
		for _, s := range streams {
			l, err := h.rdb.XLen(ctx, s).Result()
			if err != nil {
				return 0, err
			}
			n += int(l)
		}
		return n, nil
	}
	return h.timeFlat(c, warm, flat, entries, "messages/s from a JetStream stream into Redis")
}

// runNATSOut fills the input stream with cfg.warm + cfg.flat/2 messages, starts the system, and
// times the flat part from the moment JetStream has the warm-up's messages until it has the last.
func (h *harness) runNATSOut(ctx context.Context, sc scenario, srv *benchNATS) (res result) {
	if err := natsStreamAfresh(ctx, srv.js, natsOutStream, "fbout.>"); err != nil {
		return result{failed: err.Error()}
	}
	warm, flat := h.cfg.warm, h.cfg.flat/2
	stream := partitionStreams("in", 4)
	if sc.impl == implBenthos {
		stream = benthosNATSInput
	}
	if err := publishParallel(ctx, h.rdb, stream, formatPlain, phaseConn, warm+flat, 4); err != nil {
		return result{failed: err.Error()}
	}
	var c *child
	var err error
	if sc.impl == implBenthos {
		logPath := h.logPath(sc)
		c, err = h.startBenthosConfig(sc, logPath, benthosNATSOutConfig(h.srv.addr(), srv.url, logPath), false)
	} else {
		c, err = startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(), "--var", "url="+srv.url)
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	stored := func() (int, error) {
		s, err := srv.js.Stream(ctx, natsOutStream)
		if err != nil {
			return 0, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		return int(info.State.Msgs), nil
	}
	return h.timeFlat(c, warm, flat, stored, "messages/s from Redis into a JetStream stream, each acknowledged by JetStream")
}

// timeFlat waits until count reaches warm, then times the flat part until it reaches warm+flat
// (untilCount), and notes note.
func (h *harness) timeFlat(c *child, warm, flat int, count func() (int, error), note string) result {
	if err := untilCount(c, count, "messages", warm, time.Minute); err != nil {
		return result{failed: "warm-up: " + err.Error()}
	}
	cpu0 := h.cpus(c)
	t0 := time.Now()
	if err := untilCount(c, count, "messages", warm+flat, 5*time.Minute); err != nil {
		return result{failed: err.Error()}
	}
	res := h.measured(c, flat, t0, time.Now(), cpu0)
	if n, err := count(); err != nil || n != warm+flat {
		return result{failed: fmt.Sprintf("%d messages (%v), want %d", n, err, warm+flat)}
	}
	res.note("%s", note)
	return res
}

// benthosNATSInConfig is Benthos's nats_jetstream input on the stream's subjects, with a durable
// consumer and every other setting at its default, into a redis_streams output.
func benthosNATSInConfig(redisAddr, url, logPath string) string {
	var b strings.Builder
	port, _ := freePort()
	fmt.Fprintf(&b, "http:\n  address: 127.0.0.1:%d\n", port)
	fmt.Fprintf(&b, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	fmt.Fprintf(&b, "input:\n  nats_jetstream:\n    urls: [ %q ]\n    subject: \"fbin.>\"\n    durable: benthos\n", url)
	fmt.Fprintf(&b, "output:\n  redis_streams:\n    url: redis://%s\n    stream: %q\n    body_key: payload\n", redisAddr, benthosNATSInput)
	return b.String()
}

// benthosNATSOutConfig is a redis_streams input into Benthos's nats_jetstream output, every
// setting at its default (max_in_flight 1024: publications acknowledged by JetStream).
func benthosNATSOutConfig(redisAddr, url, logPath string) string {
	var b strings.Builder
	port, _ := freePort()
	fmt.Fprintf(&b, "http:\n  address: 127.0.0.1:%d\n", port)
	fmt.Fprintf(&b, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	fmt.Fprintf(&b, "input:\n  redis_streams:\n    url: redis://%s\n    streams: [ %q ]\n    consumer_group: bb1\n    body_key: payload\n", redisAddr, benthosNATSInput)
	fmt.Fprintf(&b, "output:\n  nats_jetstream:\n    urls: [ %q ]\n    subject: fbout.${! json(\"key\") }\n", url)
	return b.String()
}
