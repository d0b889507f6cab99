package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The mqtt source's and sink's proofs. Most run on a private Mosquitto of the test's own
// (/usr/sbin/mosquitto, FLOWRUN_MOSQUITTO), started on a free loopback port with its persistence
// in a temporary directory, which a test stops and starts again for an outage; the test of
// mosquitto_pub and mosquitto_sub uses the machine's Mosquitto (FLOWRUN_MQTT_URL, default
// tcp://127.0.0.1:1883), on topics of its own.

// mqttURL is the machine's Mosquitto.
func mqttURL() string {
	if u := os.Getenv("FLOWRUN_MQTT_URL"); u != "" {
		return u
	}
	return "tcp://127.0.0.1:1883"
}

// mqttBroker is a private Mosquitto of a test's.
type mqttBroker struct {
	t    *testing.T
	addr string // 127.0.0.1:port
	conf string
	mu   sync.Mutex
	cmd  *exec.Cmd
	log  *syncBuffer
}

// startMQTTBroker starts a private Mosquitto with its persistence in a temporary directory,
// which keeps sessions and their queued messages through a restart; conf adds to its
// configuration. It is stopped when the test ends.
func startMQTTBroker(t *testing.T, conf string) *mqttBroker {
	t.Helper()
	bin := os.Getenv("FLOWRUN_MOSQUITTO")
	if bin == "" {
		bin = "/usr/sbin/mosquitto"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the tests of the mqtt kinds start Mosquitto (%s, FLOWRUN_MOSQUITTO): %v", bin, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	dir := t.TempDir()
	_, port, _ := net.SplitHostPort(addr)
	user := ""
	if os.Geteuid() == 0 {
		user = "user root\n" // else Mosquitto drops to the mosquitto user, who cannot write dir
	}
	// max_queued_messages 0: the broker keeps every message queued for a session, however many
	// (its default, 1000, drops the rest); max_inflight_messages: the broker's receive maximum.
	path := filepath.Join(dir, "mosquitto.conf")
	writeFile(t, path, fmt.Sprintf(`listener %s 127.0.0.1
allow_anonymous true
persistence true
persistence_location %s/
max_queued_messages 0
max_inflight_messages 1000
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
%s%s
`, port, dir, user, conf))
	b := &mqttBroker{t: t, addr: addr, conf: path, log: &syncBuffer{}}
	b.start()
	t.Cleanup(b.stop)
	return b
}

// start starts the broker and waits until it takes connections.
func (b *mqttBroker) start() {
	b.t.Helper()
	bin := os.Getenv("FLOWRUN_MOSQUITTO")
	if bin == "" {
		bin = "/usr/sbin/mosquitto"
	}
	b.mu.Lock()
	b.cmd = exec.Command(bin, "-c", b.conf)
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	if err := b.cmd.Start(); err != nil {
		b.mu.Unlock()
		b.t.Fatal(err)
	}
	b.mu.Unlock()
	waitFor(b.t, "Mosquitto to take connections", func() bool {
		c, err := net.Dial("tcp", b.addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
}

// stop stops the broker (SIGTERM: it saves its persistence) and waits for it to end.
func (b *mqttBroker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(os.Interrupt)
	_ = b.cmd.Wait()
	b.cmd = nil
}

// url is the broker's URL.
func (b *mqttBroker) url() string { return "tcp://" + b.addr }

// mqttName is a name unique to this run of the test: a topic's first level, a client ID.
func mqttName(t *testing.T) string {
	return fmt.Sprintf("flowrun-%s-%d-%d", strings.NewReplacer("/", "-").Replace(t.Name()), os.Getpid(), prefixes.Add(1))
}

// mqttClient is a test's MQTT 5 client that connects again, with its session, whenever the
// connection is lost: a publisher, or a reader of what a sink published.
type mqttClient struct {
	t        *testing.T
	addr     string
	clientID string
	onMsg    func(*paho.Publish) // nil for a publisher
	filters  []string

	mu     sync.Mutex
	client *paho.Client
	closed bool
}

// newMQTTClient connects a client with a persistent session (a reader subscribes to filters at
// QoS 1 and is given each message, acknowledged once onMsg returns).
func newMQTTClient(t *testing.T, addr, clientID string, onMsg func(*paho.Publish), filters ...string) *mqttClient {
	t.Helper()
	c := &mqttClient{t: t, addr: strings.TrimPrefix(strings.TrimPrefix(addr, "tcp://"), "mqtt://"), clientID: clientID, onMsg: onMsg, filters: filters}
	client, err := c.connected()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	if onMsg != nil {
		// A reader connects again as soon as its connection ends (a broker restarting).
		go func() {
			for {
				<-client.Done()
				c.mu.Lock()
				closed := c.closed
				c.mu.Unlock()
				if closed {
					return
				}
				if client, err = c.connected(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	return c
}

// connected returns the client, connecting again (for up to a minute) if its connection ended.
func (c *mqttClient) connected() (*paho.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		select {
		case <-c.client.Done():
		default:
			return c.client, nil
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		client, err := c.dial()
		if err == nil {
			c.client = client
			return client, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connecting to %s: %w", c.addr, err)
		}
		time.Sleep(50 * time.Millisecond) // a broker restarting: try again
	}
}

func (c *mqttClient) dial() (*paho.Client, error) {
	conn, err := net.Dial("tcp", c.addr)
	if err != nil {
		return nil, err
	}
	cfg := paho.ClientConfig{Conn: conn, OnClientError: func(error) {}, OnServerDisconnect: func(*paho.Disconnect) {}}
	if c.onMsg != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			c.onMsg(r.Packet)
			return true, nil
		}}
	}
	client := paho.NewClient(cfg)
	expiry, receive := uint32(3600), uint16(1000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Connect(ctx, &paho.Connect{ClientID: c.clientID, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry, ReceiveMaximum: &receive}}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if len(c.filters) > 0 {
		sub := &paho.Subscribe{}
		for _, f := range c.filters {
			sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: 1, RetainHandling: 1})
		}
		if _, err := client.Subscribe(ctx, sub); err != nil {
			_ = client.Disconnect(&paho.Disconnect{})
			return nil, err
		}
	}
	return client, nil
}

// publish publishes p at QoS 1 until the broker confirms it, connecting again as needed.
func (c *mqttClient) publish(p *paho.Publish) {
	c.t.Helper()
	p.QoS = 1
	deadline := time.Now().Add(time.Minute)
	for {
		client, err := c.connected()
		if err != nil {
			c.t.Error(err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = client.Publish(ctx, p)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Errorf("publishing on %s: %v", p.Topic, err)
			return
		}
		time.Sleep(20 * time.Millisecond) // the broker restarting: try again
	}
}

// close disconnects, keeping the session until it expires (an hour; the private broker goes first).
func (c *mqttClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil && !c.closed {
		_ = c.client.Disconnect(&paho.Disconnect{})
		c.closed = true
	}
}

// mqttTraceparent is the trace context that message i carries in.
func mqttTraceparent(i int) string { return natsTraceparent(i) }

// mqttPublish publishes messages [from, to) on the topics <base>/k0 to <base>/k9 (i's on
// k<i%10>, each topic's in order, the ten topics at once), i's payload {"i": i}, with the user
// properties origin: test, message_id: i when ids is set, and a traceparent on every 10th.
func mqttPublish(t *testing.T, pub *mqttClient, base string, from, to int, ids bool) {
	t.Helper()
	var wg sync.WaitGroup
	for k := 0; k < 10; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from; i < to; i++ {
				if i%10 != k {
					continue
				}
				user := paho.UserProperties{{Key: "origin", Value: "test"}}
				if ids {
					user = append(user, paho.UserProperty{Key: "message_id", Value: strconv.Itoa(i)})
				}
				if i%10 == 0 {
					user = append(user, paho.UserProperty{Key: "traceparent", Value: mqttTraceparent(i)})
				}
				pub.publish(&paho.Publish{Topic: fmt.Sprintf("%s/k%d", base, k), Payload: fmt.Appendf(nil, `{"i":%d}`, i),
					Properties: &paho.PublishProperties{User: user}})
			}
		}()
	}
	wg.Wait()
}

// mqttSourcePipeline reads <base>/# into topic "in" (4 partitions, keyed by the MQTT topic).
func mqttSourcePipeline(prefix, delivery, url, base, clientID string) string {
	return fmt.Sprintf(`
pipeline "mqttsource" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
}
source "mq" {
  kind      = "mqtt"
  url       = %q
  topics    = [%q]
  client_id = %q
  output    = topic.in
}
`, prefix, delivery, url, base+"/#", clientID)
}

// mqttTopic reads topic "in": how many times each message i is there, checking each entry's key
// (its MQTT topic), its headers, and for every 10th its trace context; and each key's messages
// are in order (of their first appearance, when some are there twice).
func mqttTopic(t *testing.T, c *redis.Client, prefix, base string) map[int]int {
	t.Helper()
	seen := map[int]int{}
	for _, s := range (redis.Keys{Prefix: prefix}).Streams("in", 4) {
		last := map[string]int{}
		for after := "0"; ; {
			recs, err := c.Read(context.Background(), s, after, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				break
			}
			for _, r := range recs {
				after = r.ID
				var m struct{ I int }
				if err := json.Unmarshal(r.Payload, &m); err != nil {
					t.Fatalf("entry %s: %v", r.ID, err)
				}
				if want := fmt.Sprintf("%s/k%d", base, m.I%10); r.Key != want {
					t.Fatalf("message %d has key %q, want its MQTT topic %q", m.I, r.Key, want)
				}
				if r.Headers["origin"] != "test" {
					t.Fatalf("message %d has headers %v, want the user property origin: test", m.I, r.Headers)
				}
				if m.I%10 == 0 && r.TraceParent != mqttTraceparent(m.I) {
					t.Fatalf("message %d has traceparent %q, want %q", m.I, r.TraceParent, mqttTraceparent(m.I))
				}
				if prev, ok := last[r.Key]; ok && seen[m.I] == 0 && m.I < prev {
					t.Fatalf("on %s, message %d after %d", r.Key, m.I, prev)
				}
				if seen[m.I] == 0 {
					last[r.Key] = m.I
				}
				seen[m.I]++
			}
		}
	}
	return seen
}

// checkEachAtLeastOnce checks that messages [0, n) are each there, and nothing else; it returns
// how many are there more than once.
func checkEachAtLeastOnce(t *testing.T, seen map[int]int, n int) (twice int) {
	t.Helper()
	for i, k := range seen {
		if i < 0 || i >= n || k < 1 {
			t.Errorf("message %d is there %d times", i, k)
		}
		if k > 1 {
			twice++
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages, want %d", len(seen), n)
	}
	return twice
}

// TestMQTTSourceWritesEachMessageOnce: 3000 messages published on ten topics, half before the
// run (queued in the source's session) and half during it, are each in the topic once, keyed by
// their MQTT topics, in order on each, with their user properties and trace context; and once
// Redis has them, the broker has each acknowledged: a second run of the source finds nothing.
func TestMQTTSourceWritesEachMessageOnce(t *testing.T) {
	const n = 3000
	broker := startMQTTBroker(t, "")
	base, clientID := mqttName(t), mqttName(t)
	c := server.open(t)
	plan := buildSource(t, mqttSourcePipeline("ignored", "at_least_once", broker.url(), base, clientID))
	// The session exists before the first publications: the source's first run made it (here
	// a client of the test's, with the same client ID and subscription, does it).
	newMQTTClient(t, broker.addr, clientID, func(*paho.Publish) { t.Error("a message before the run") }, base+"/#").close()
	pub := newMQTTClient(t, broker.addr, mqttName(t), nil)
	mqttPublish(t, pub, base, 0, n/2, false)
	entries := func() int {
		total := 0
		for _, k := range mqttTopic(t, c, plan.KeyPrefix, base) {
			total += k
		}
		return total
	}
	go mqttPublish(t, pub, base, n/2, n, false)
	runServiceUntil(t, c, plan, func() bool { return entries() >= n })
	if got := entries(); got != n {
		t.Errorf("the first run wrote %d entries, want %d", got, n)
	}
	// A second run: what the first acknowledged, the broker does not deliver again; a marker
	// message published now is the next thing the source writes.
	pub.publish(&paho.Publish{Topic: base + "/k0", Payload: []byte(`{"i":0,"marker":true}`),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "origin", Value: "test"}, {Key: "traceparent", Value: mqttTraceparent(0)}}}})
	runServiceUntil(t, c, plan, func() bool { return entries() >= n+1 })
	seen := mqttTopic(t, c, plan.KeyPrefix, base)
	if seen[0] != 2 {
		t.Errorf("message 0 and the marker: %d entries of i = 0, want 2", seen[0])
	}
	seen[0] = 1
	checkEachOnce(t, seen, n)
	t.Logf("%d messages, each once in the topic, in order on each MQTT topic; a second run wrote only the marker", n)
}

// TestMQTTSourceWaitsOutABrokerRestart reads from a private Mosquitto that is stopped once a
// first part is in the topic, and started again (its persistence keeps the source's session):
// the source tries to connect meanwhile, and once the broker is back, the messages published
// then (queued in the session while the source waits to try again) arrive too; the publisher
// gives IDs, so with effectively-once delivery each of 3000 is in the topic once, though what was
// in flight at the stop is delivered again.
func TestMQTTSourceWaitsOutABrokerRestart(t *testing.T) {
	t.Parallel()
	const first, n = 1000, 3000
	broker := startMQTTBroker(t, "")
	base, clientID := mqttName(t), mqttName(t)
	c := server.open(t)
	plan := buildSource(t, mqttSourcePipeline("ignored", "effectively_once", broker.url(), base, clientID))
	pub := newMQTTClient(t, broker.addr, mqttName(t), nil)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
		ended <- err
	}()
	entries := func() int {
		select {
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		default:
		}
		total := 0
		for _, k := range mqttTopic(t, c, plan.KeyPrefix, base) {
			total += k
		}
		return total
	}
	// The source's session is there once it has subscribed: then publish.
	waitFor(t, "the source to subscribe", func() bool {
		pub.publish(&paho.Publish{Topic: base + "/k0", Payload: []byte(`{"i":0}`), Properties: &paho.PublishProperties{User: paho.UserProperties{
			{Key: "origin", Value: "test"}, {Key: "message_id", Value: "0"}, {Key: "traceparent", Value: mqttTraceparent(0)}}}})
		return entries() > 0
	})
	mqttPublish(t, pub, base, 1, first, true)
	waitFor(t, "the first part in the topic", func() bool { return entries() == first })
	broker.stop()
	waitFor(t, "the source to find the broker away", func() bool {
		return strings.Count(log.String(), "mqtt: the connection to the broker failed") >= 2
	})
	broker.start()
	mqttPublish(t, pub, base, first, n, true)
	waitFor(t, "every message in the topic", func() bool { return entries() >= n })
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	checkEachOnce(t, mqttTopic(t, c, plan.KeyPrefix, base), n)
	t.Logf("%d messages before the broker stopped, %d attempts to connect while it was away, each of %d once at the end",
		first, strings.Count(log.String(), "mqtt: the connection to the broker failed"), n)
}
