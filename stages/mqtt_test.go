package stages

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/flowrun/flowrun/flow"
)

// The mqtt kinds without a broker: what validate refuses, the password kept out of output, and
// the user properties' way in and out. Their proofs against Mosquitto are in runtime
// (mqtt_test.go).

// TestMQTTValidates checks what validate says of the kinds' attributes.
func TestMQTTValidates(t *testing.T) {
	for _, c := range []struct{ block, want string }{
		{`source "m" {
  kind      = "mqtt"
  url       = "http://127.0.0.1:1883"
  topics    = ["a/#"]
  client_id = "c"
  output    = topic.in
}`, "Invalid url"},
		{`source "m" {
  kind      = "mqtt"
  url       = "tcp://127.0.0.1:1883"
  topics    = ["a/#/b"]
  client_id = "c"
  output    = topic.in
}`, "Invalid topics"},
		{`source "m" {
  kind      = "mqtt"
  url       = "tcp://127.0.0.1:1883"
  topics    = ["a/b+"]
  client_id = "c"
  output    = topic.in
}`, "Invalid topics"},
		{`source "m" {
  kind      = "mqtt"
  url       = "tcp://127.0.0.1:1883"
  topics    = ["a"]
  output    = topic.in
}`, "client_id"},
		{`source "m" {
  kind      = "mqtt"
  url       = "tcp://127.0.0.1:1883"
  topics    = ["a"]
  client_id = "c"
  qos       = 2
  output    = topic.in
}`, "qos"},
		{`source "m" {
  kind           = "mqtt"
  url            = "tcp://127.0.0.1:1883"
  topics         = ["a"]
  client_id      = "c"
  session_expiry = "10ms"
  output         = topic.in
}`, "Invalid session_expiry"},
		{`sink "m" {
  kind  = "mqtt"
  input = topic.in
  url   = "tcp://h:1883/path"
  topic = "x"
}`, "Invalid url"},
		{`sink "m" {
  kind    = "mqtt"
  input   = topic.in
  url     = "tcp://h:1883"
  topic   = "x"
  timeout = "0s"
}`, "Invalid timeout"},
		{`sink "m" {
  kind  = "mqtt"
  input = topic.in
  url   = "tcp://h:1883"
  topic = value.x
}`, "value"},
	} {
		src := "pipeline \"t\" {}\ntopic \"in\" {}\nsource \"s\" {\n  kind = \"stdin\"\n  output = topic.in\n}\n" + c.block
		cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{})
		}
		if !diags.HasErrors() || !strings.Contains(diags.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.block, diags, c.want)
		}
	}
}

// TestMQTTHidesThePassword: a password in the url is a secret of the plan, and a sink whose
// broker is away fails transiently, without it.
func TestMQTTHidesThePassword(t *testing.T) {
	const url = "tcp://flowrun:s3cret-pw@127.0.0.1:1"
	p := plan(t, fmt.Sprintf(`
sink "m" {
  kind    = "mqtt"
  input   = topic.in
  url     = %q
  topic   = "out/${key}"
  timeout = "300ms"
}
`, url))
	if got := p.Redact("url " + url); strings.Contains(got, "s3cret") {
		t.Errorf("the plan does not hide the password: %s", got)
	}
	if d := fmt.Sprint(p.Describe()); strings.Contains(d, "s3cret") {
		t.Errorf("the plan's description shows the password: %s", d)
	}
	s := p.Sinks[0]
	k, _ := SinkKindOf(s)
	made, err := k.New(s, Env{Pipeline: "t", Redact: p.Redact})
	if err != nil {
		t.Fatal(err)
	}
	defer made.(*mqttSink).Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m := NewMessage("k1", []byte(`{"a":1}`), nil)
	batch := []Delivery{{Message: &m, ID: "1-0"}}
	made.(BatchSink).DeliverBatch(ctx, batch)
	if err := batch[0].Err; err == nil || !IsTransient(err) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("a delivery to port 1: %v; want a transient error without the password", err)
	}
	t.Logf("a delivery to port 1: %v", batch[0].Err)
}

// TestMQTTUserProperties: a message's user properties become its headers (the first value of
// each name) but for its trace context; the sink's publication carries the headers back, the
// entry's identity in message_id (in place of a header of that name) and the trace context.
func TestMQTTUserProperties(t *testing.T) {
	headers, parent, state := fromMQTTProperties(&paho.PublishProperties{User: paho.UserProperties{
		{Key: "origin", Value: "shop"}, {Key: "origin", Value: "second"}, {Key: "message_id", Value: "7"},
		{Key: "traceparent", Value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, {Key: "tracestate", Value: "k=v"},
	}})
	if len(headers) != 2 || headers["origin"] != "shop" || headers["message_id"] != "7" ||
		parent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || state != "k=v" {
		t.Errorf("headers %v, traceparent %q, tracestate %q", headers, parent, state)
	}
	p := plan(t, `
sink "m" {
  kind  = "mqtt"
  input = topic.in
  url   = "tcp://127.0.0.1:1"
  topic = "out/${key}"
}
`)
	k, _ := SinkKindOf(p.Sinks[0])
	made, err := k.New(p.Sinks[0], Env{Pipeline: "t"})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMessage("k1", []byte(`{"a":1}`), headers)
	pub, err := made.(*mqttSink).publication(Delivery{Message: &m, ID: "5-0", Partition: 2, Traceparent: parent, Tracestate: state})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(pub.Properties.User); pub.Topic != "out/k1" || pub.QoS != 1 ||
		got != "[{origin shop} {message_id t/m/2/5-0} {traceparent 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01} {tracestate k=v}]" {
		t.Errorf("published on %s at QoS %d with user properties %s", pub.Topic, pub.QoS, got)
	}
}

// TestAnMQTTSourceHandsOverNothingAfterALoss checks that the messages a source's session passes on
// are those that came up to some message, without a gap: none is handed over once the connection
// is lost (the broker delivers again, in order, what was not acknowledged), though the loop has room
// for it. A message dropped while a later one went on arrived after it (TestMQTTRoundTripThroughKills
// saw "message 4961 after 4981" once in a few dozen runs).
func TestAnMQTTSourceHandsOverNothingAfterALoss(t *testing.T) {
	msgs, lost := make(chan *paho.Publish, 200), make(chan struct{})
	for i := range 3 {
		handOver(msgs, lost, &paho.Publish{Topic: fmt.Sprint(i)})
	}
	close(lost)
	for i := 3; i < 100; i++ {
		handOver(msgs, lost, &paho.Publish{Topic: fmt.Sprint(i)}) // returns: it does not wait
	}
	if len(msgs) != 3 {
		t.Fatalf("%d messages handed over, want the 3 that came before the loss", len(msgs))
	}
	for i := range 3 {
		if p := <-msgs; p.Topic != fmt.Sprint(i) {
			t.Fatalf("message %s handed over as number %d", p.Topic, i)
		}
	}
	full := make(chan *paho.Publish)
	open := make(chan struct{})
	done := make(chan struct{})
	go func() { handOver(full, open, &paho.Publish{}); close(done) }()
	close(open) // a loss while the loop has no room: it gives up
	<-done
}
