package stages

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The amqp kinds without a broker: what validate refuses, the password kept out of output, and
// the headers' way in. Their proofs against RabbitMQ are in runtime (amqp_test.go).

// TestAMQPValidates checks what validate says of the kinds' attributes.
func TestAMQPValidates(t *testing.T) {
	checkPlanErrors(t, []struct{ block, want string }{
		{`source "a" {
  kind   = "amqp"
  url    = "http://127.0.0.1:5672"
  queue  = "q"
  output = topic.in
}`, "Invalid url"},
		{`source "a" {
  kind        = "amqp"
  url         = "amqp://127.0.0.1:5672"
  queue       = "q"
  binding_key = "x.#"
  output      = topic.in
}`, "binding_key without exchange"},
		{`source "a" {
  kind     = "amqp"
  url      = "amqp://127.0.0.1:5672"
  queue    = "q"
  prefetch = 0
  output   = topic.in
}`, "prefetch"},
		{`source "a" {
  kind   = "amqp"
  url    = "amqp://127.0.0.1:5672"
  queue  = ""
  output = topic.in
}`, "Invalid queue"},
		{`sink "a" {
  kind        = "amqp"
  input       = topic.in
  url         = "amqp://h:5672"
  routing_key = "x"
  timeout     = "0s"
}`, "Invalid timeout"},
		{`sink "a" {
  kind        = "amqp"
  input       = topic.in
  url         = "amqp://h:5672"
  routing_key = value.x
}`, "value"},
	})
}

// TestAMQPHidesThePassword: a password in the url is a secret of the plan, and a sink whose
// broker is away fails transiently, without it.
func TestAMQPHidesThePassword(t *testing.T) {
	const url = "amqp://flowrun:s3cret-pw@127.0.0.1:1/"
	p := plan(t, fmt.Sprintf(`
sink "a" {
  kind        = "amqp"
  input       = topic.in
  url         = %q
  routing_key = "out.${key}"
  timeout     = "300ms"
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
	defer made.(*amqpSink).Close()
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

// TestAMQPHeadersIn: an AMQP message's headers become the message's, as strings, and its trace
// context is taken apart.
func TestAMQPHeadersIn(t *testing.T) {
	headers, parent, state := fromAMQPHeaders(amqp.Table{
		"origin":      "shop",
		"attempt":     int32(3),
		"raw":         []byte("b"),
		"nested":      amqp.Table{"a": "b"},
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "k=v",
	})
	want := map[string]string{"origin": "shop", "attempt": "3", "raw": "b", "nested": `{"a":"b"}`}
	if fmt.Sprint(headers) != fmt.Sprint(want) || parent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || state != "k=v" {
		t.Errorf("headers %v, traceparent %q, tracestate %q", headers, parent, state)
	}
}
