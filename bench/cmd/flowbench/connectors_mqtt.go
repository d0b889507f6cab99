package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// The MQTT scenarios of issue 25, on a Mosquitto of the harness's own, started anew for each
// scenario on a free loopback port (never the machine's), with max_queued_messages 0 so that a
// session keeps every message queued for it (Mosquitto's default keeps 1000 and drops the rest):
//
//   - MQTT-IN: messages published at QoS 1 beforehand on 4 topics, queued for a persistent session
//     made before the run under the reader's client ID; read by flowrun's mqtt source into a topic
//     of 4 partitions, and by Benthos's mqtt input (the same session, clean_session false) into a
//     redis_streams output (messages/s, from the warm-up's last to the last).
//   - MQTT-OUT: a stream of Redis filled beforehand, published at QoS 1 by flowrun's mqtt sink and
//     by Benthos's mqtt output; the harness's subscriber (QoS 1) counts what arrives (messages/s).

const (
	kindMQTTIn kind = iota + 600
	kindMQTTOut
	mqttInClientID   = "flowbench-in"
	benthosMQTTInput = benthosStreamNS + ":{mqttin}"
)

var mqttScenarios = []scenario{
	{name: "MQTT-IN", kind: kindMQTTIn, impl: implFlowrun, vs: "Benthos MQTT-IN", pipeline: "mqtt-in"},
	{name: "Benthos MQTT-IN", kind: kindMQTTIn, impl: implBenthos},
	{name: "MQTT-OUT", kind: kindMQTTOut, impl: implFlowrun, stages: 1, vs: "Benthos MQTT-OUT", pipeline: "mqtt-out"},
	{name: "Benthos MQTT-OUT", kind: kindMQTTOut, impl: implBenthos, stages: 1},
}

func init() {
	scenarios = append(scenarios, mqttScenarios...)
	benchPipelines = append(benchPipelines,
		benchPipeline{name: "mqtt-in", src: mqttInHCL},
		benchPipeline{name: "mqtt-out", src: mqttOutHCL},
	)
}

const mqttInHCL = `# Written by flowbench: MQTT topics fbin/k0 to fbin/k3 into a topic of 4 partitions.
pipeline "bench" {
  key_prefix = "fb"
}
variable "url" { default = "tcp://127.0.0.1:1883" } # the harness sets its broker
source "in" {
  kind      = "mqtt"
  url       = var.url
  topics    = ["fbin/#"]
  client_id = "flowbench-in"
  output    = topic.in
}
topic "in" { partitions = 4 }
`

const mqttOutHCL = `# Written by flowbench: a topic of 4 partitions published to MQTT topics fbout/<key>.
pipeline "bench" {
  key_prefix = "fb"
}
variable "url" { default = "tcp://127.0.0.1:1883" } # the harness sets its broker
topic "in" {
  partitions = 4
  key        = msg.key
}
sink "out" {
  kind  = "mqtt"
  input = topic.in
  url   = var.url
  topic = "fbout/${msg.key}"
}
`

// startMosquitto starts a Mosquitto of the scenario's own and returns its address; it is stopped
// when the scenario ends (stop).
func (h *harness) startMosquitto() (addr string, stop func(), err error) {
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = "/usr/sbin/mosquitto"
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp(h.tmp, "mosquitto-")
	if err != nil {
		return "", nil, err
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root\n" // else Mosquitto drops to the mosquitto user
	}
	conf := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listener %d 127.0.0.1\nallow_anonymous true\npersistence false\n"+
		"max_queued_messages 0\nmax_inflight_messages 1000\nset_tcp_nodelay true\n%s", port, user), 0o600); err != nil {
		return "", nil, err
	}
	log, err := os.Create(filepath.Join(dir, "mosquitto.log"))
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return "", nil, fmt.Errorf("a Mosquitto of the harness's own (%s): %w", bin, err)
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = log.Close()
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("the harness's Mosquitto at %s did not listen within 30s: %v", addr, err)
		}
	}
}

// mqttConnect connects an MQTT 5 client with a session that outlives it (an hour), subscribed to
// filter at QoS 1 when filter is set, calling received for each message it is given.
func mqttConnect(ctx context.Context, addr, clientID, filter string, received func()) (*paho.Client, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg := paho.ClientConfig{Conn: conn, OnClientError: func(error) {}, OnServerDisconnect: func(*paho.Disconnect) {}}
	if received != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
			received()
			return true, nil
		}}
	}
	c := paho.NewClient(cfg)
	expiry, inflight := uint32(3600), uint16(1000)
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry, ReceiveMaximum: &inflight}}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if filter != "" {
		if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
			_ = c.Disconnect(&paho.Disconnect{})
			return nil, err
		}
	}
	return c, nil
}

// mqttFill publishes n messages of the connectors' phase at QoS 1 on fbin/k0 to fbin/k3, many at
// once, each confirmed by the broker.
func mqttFill(ctx context.Context, addr string, n int) error {
	c, err := mqttConnect(ctx, addr, "flowbench-fill", "", nil)
	if err != nil {
		return err
	}
	defer func() { _ = c.Disconnect(&paho.Disconnect{}) }()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, payloadSize)
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				putPayload(p, time.Now().UnixNano(), phaseConn, i)
				if _, err := c.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("fbin/k%d", i%4), QoS: 1, Payload: append([]byte(nil), p...)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// mqttRun runs an MQTT scenario (see harness.run).
func (h *harness) mqttRun(ctx context.Context, sc scenario) (res result) {
	addr, stop, err := h.startMosquitto()
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stop()
	if sc.kind == kindMQTTIn {
		return h.runMQTTIn(ctx, sc, addr)
	}
	return h.runMQTTOut(ctx, sc, addr)
}

// runMQTTIn makes the reader's session, queues cfg.warm + cfg.flat/2 messages for it, starts the
// system, and times the flat part from the moment the warm-up's messages are in Redis until the
// last one is.
func (h *harness) runMQTTIn(ctx context.Context, sc scenario, addr string) (res result) {
	session, err := mqttConnect(ctx, addr, mqttInClientID, "fbin/#", nil)
	if err != nil {
		return result{failed: err.Error()}
	}
	_ = session.Disconnect(&paho.Disconnect{}) // the session stays, and takes what is published
	warm, flat := h.cfg.warm, h.cfg.flat/2
	if err := mqttFill(ctx, addr, warm+flat); err != nil {
		return result{failed: "filling the session: " + err.Error()}
	}
	streams := []string{benthosMQTTInput}
	var c *child
	if sc.impl == implBenthos {
		logPath := h.logPath(sc)
		c, err = h.startBenthosConfig(sc, logPath, benthosMQTTConfig(h.srv.addr(), addr, true, logPath), false)
	} else {
		streams = strings.Split(partitionStreams("in", 4), partSep)
		c, err = startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(),
			"--var", "url=tcp://"+addr)
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
	return h.timeFlat(c, warm, flat, entries, "messages/s from an MQTT session (QoS 1) into Redis")
}

// runMQTTOut fills the input stream with cfg.warm + cfg.flat/2 messages, subscribes to what the
// system publishes, starts it, and times the flat part from the moment the subscriber has had the
// warm-up's messages until it has had the last.
func (h *harness) runMQTTOut(ctx context.Context, sc scenario, addr string) (res result) {
	warm, flat := h.cfg.warm, h.cfg.flat/2
	stream := partitionStreams("in", 4)
	if sc.impl == implBenthos {
		stream = benthosMQTTInput
	}
	if err := publishParallel(ctx, h.rdb, stream, formatPlain, phaseConn, warm+flat, 4); err != nil {
		return result{failed: err.Error()}
	}
	var got atomic.Int64
	sub, err := mqttConnect(ctx, addr, "flowbench-out", "fbout/#", func() { got.Add(1) })
	if err != nil {
		return result{failed: err.Error()}
	}
	defer func() { _ = sub.Disconnect(&paho.Disconnect{}) }()
	var c *child
	if sc.impl == implBenthos {
		logPath := h.logPath(sc)
		c, err = h.startBenthosConfig(sc, logPath, benthosMQTTConfig(h.srv.addr(), addr, false, logPath), false)
	} else {
		c, err = startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(),
			"--var", "url=tcp://"+addr)
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	received := func() (int, error) { return int(got.Load()), nil }
	return h.timeFlat(c, warm, flat, received, "messages/s from Redis to MQTT (QoS 1), as a subscriber received them")
}

// benthosMQTTConfig is Benthos's mqtt input on the reader's persistent session (clean_session
// false) into a redis_streams output (in), or a redis_streams input into its mqtt output on
// fbout/<key> (out), QoS 1 and every other setting at its default.
func benthosMQTTConfig(redisAddr, brokerAddr string, in bool, logPath string) string {
	port, _ := freePort()
	config := fmt.Sprintf("http:\n  address: 127.0.0.1:%d\nlogger:\n  level: WARN\n  file:\n    path: %q\n", port, logPath)
	if in {
		return config + fmt.Sprintf("input:\n  mqtt:\n    urls: [ \"tcp://%s\" ]\n    client_id: %s\n    clean_session: false\n    topics: [ \"fbin/#\" ]\n    qos: 1\n", brokerAddr, mqttInClientID) +
			fmt.Sprintf("output:\n  redis_streams:\n    url: redis://%s\n    stream: %q\n    body_key: payload\n", redisAddr, benthosMQTTInput)
	}
	return config + fmt.Sprintf("input:\n  redis_streams:\n    url: redis://%s\n    streams: [ %q ]\n    consumer_group: bb1\n    body_key: payload\n", redisAddr, benthosMQTTInput) +
		fmt.Sprintf("output:\n  mqtt:\n    urls: [ \"tcp://%s\" ]\n    client_id: flowbench-benthos-out\n    topic: 'fbout/${! json(\"key\") }'\n    qos: 1\n", brokerAddr)
}
