package runtime_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestMQTTWithMosquittoClientsCarriesTheTrace runs on the machine's Mosquitto (FLOWRUN_MQTT_URL),
// with Mosquitto's own clients, tracing: what mosquitto_pub publishes with a traceparent comes
// into the topic keyed by its MQTT topic, with its user properties as headers, and its trace goes
// on in the pipeline; what the sink publishes, mosquitto_sub reads, with the user properties and
// a traceparent of the same trace, whose span is the pipeline's, a child of the publisher's.
func TestMQTTWithMosquittoClientsCarriesTheTrace(t *testing.T) {
	u, err := url.Parse(mqttURL())
	if err != nil {
		t.Fatal(err)
	}
	host, port := u.Hostname(), u.Port()
	addr := net.JoinHostPort(host, port)
	base, clientID := mqttName(t), mqttName(t)
	// The source's session is made, and removed when the test ends: the broker is shared.
	newMQTTClient(t, addr, clientID, func(*paho.Publish) {}, base+"/in/#").close()
	t.Cleanup(func() { mqttForget(t, addr, clientID) })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	plan := buildSource(t, fmt.Sprintf(`
pipeline "mqttclients" {}
topic "orders" {
  partitions = 2
}
source "orders_in" {
  kind           = "mqtt"
  url            = %[1]q
  topics         = ["%[2]s/in/#"]
  client_id      = %[3]q
  session_expiry = "5m"
  output         = topic.orders
}
stage "big" {
  kind  = "filter"
  input = topic.orders
  where = msg.amount >= 100
}
sink "big_out" {
  kind  = "mqtt"
  input = stage.big
  url   = %[1]q
  topic = "%[2]s/out/${trimprefix(key, "%[2]s/in/")}"
}
`, mqttURL(), base, clientID))
	// mosquitto_sub reads the sink's topics (-d says when it has subscribed; stdbuf makes it
	// say so at once, its output being a pipe).
	sub := exec.Command("stdbuf", "-oL", "mosquitto_sub", "-h", host, "-p", port, "-V", "5", "-q", "1", "-t", base+"/out/#", "-C", "1", "-W", "60",
		"-F", "%t|%P|%p", "-d")
	stdout, err := sub.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(); err != nil {
		t.Fatalf("mosquitto_sub: %v", err)
	}
	t.Cleanup(func() { _ = sub.Process.Kill(); _ = sub.Wait() })
	lines := make(chan string, 16)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	for line := range lines {
		if strings.Contains(line, "received SUBACK") {
			break
		}
	}
	c := server.open(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log), TracerProvider: tp})
		ended <- err
	}()
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, m := range []struct{ topic, payload, id string }{
		{"eu", `{"id":1,"amount":250}`, "order-1"}, {"us", `{"id":2,"amount":5}`, "order-2"},
	} {
		out, err := exec.Command("mosquitto_pub", "-h", host, "-p", port, "-V", "5", "-q", "1", "-t", base+"/in/"+m.topic, "-m", m.payload,
			"-D", "publish", "user-property", "traceparent", parent, "-D", "publish", "user-property", "message_id", m.id,
			"-D", "publish", "user-property", "origin", "shop").CombinedOutput()
		if err != nil {
			t.Fatalf("mosquitto_pub: %v: %s", err, out)
		}
	}
	var got string
	deadline := time.After(time.Minute)
	for got == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("mosquitto_sub ended without a message\n%s", log.String())
			}
			if strings.HasPrefix(line, base+"/out/") {
				got = line
			}
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		case <-deadline:
			t.Fatalf("mosquitto_sub read nothing in a minute\n%s", log.String())
		}
	}
	// Order 2, which the filter drops, comes into the topic on its own way: not necessarily before
	// order 1 is out.
	waitFor(t, "both orders in the topic", func() bool {
		var n int64
		for _, s := range (redis.Keys{Prefix: plan.KeyPrefix}).Streams("orders", 2) {
			l, _ := c.Universal().XLen(context.Background(), s).Result()
			n += l
		}
		return n >= 2
	})
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	// topic|user properties|payload
	parts := strings.SplitN(got, "|", 3)
	if len(parts) != 3 || parts[0] != base+"/out/eu" || parts[2] != `{"id":1,"amount":250}` || !strings.Contains(parts[1], "origin:shop") ||
		!strings.Contains(parts[1], "message_id:mqttclients/big_out/") {
		t.Fatalf("mosquitto_sub read %q, want order 1 on %s/out/eu with its user properties and a message_id of the sink's", got, base)
	}
	var tp2 string
	for _, f := range strings.Fields(parts[1]) {
		if v, ok := strings.CutPrefix(f, "traceparent:"); ok {
			tp2 = v
		}
	}
	trace := strings.Split(tp2, "-")
	if len(trace) != 4 || trace[1] != "4bf92f3577b34da6a3ce929d0e0e4736" || trace[2] == "00f067aa0ba902b7" {
		t.Fatalf("the sink published traceparent %q; want one of trace 4bf92f3577b34da6a3ce929d0e0e4736, of a span of the pipeline's", tp2)
	}
	var spanOf string
	sent := false
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() != trace[1] {
			continue
		}
		if s.SpanContext().SpanID().String() == trace[2] {
			spanOf = s.Name()
		}
		if s.Name() == "send orders" {
			sent = true
			if s.Parent().SpanID().String() != "00f067aa0ba902b7" {
				t.Errorf("the source's span %q has parent %s, want the publisher's span 00f067aa0ba902b7", s.Name(), s.Parent().SpanID())
			}
		}
	}
	if spanOf == "" || !sent {
		t.Fatalf("the traceparent out, %s, names no span the pipeline recorded (%q), or the source's span is missing (%v)", tp2, spanOf, sent)
	}
	// The topic has both orders, keyed by their MQTT topics, with their user properties.
	keys := map[string]string{}
	for _, s := range (redis.Keys{Prefix: plan.KeyPrefix}).Streams("orders", 2) {
		recs, err := c.Read(context.Background(), s, "0", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			keys[r.Key] = r.Headers["message_id"] + " " + r.Headers["origin"]
		}
	}
	if keys[base+"/in/eu"] != "order-1 shop" || keys[base+"/in/us"] != "order-2 shop" || len(keys) != 2 {
		t.Errorf("the topic has %v; want the two orders keyed by their MQTT topics, with message_id and origin", keys)
	}
	t.Logf("mosquitto_pub -> source -> filter -> sink -> mosquitto_sub: %q; its traceparent's span is the pipeline's %q, in the publisher's trace", got, spanOf)
}

// mqttForget removes a client's session from a broker: a connection with clean start and no
// session expiry.
func mqttForget(t *testing.T, addr, clientID string) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Log(err)
		return
	}
	client := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Connect(ctx, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Log(err)
		_ = conn.Close()
		return
	}
	_ = client.Disconnect(&paho.Disconnect{})
}
