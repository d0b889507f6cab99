package stages

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The nats kinds without a server: what validate refuses, the password kept out of output, and
// the headers' way in. Their proofs against a NATS server are in runtime (nats_test.go).

// TestNATSValidates checks what validate says of the kinds' attributes.
func TestNATSValidates(t *testing.T) {
	checkPlanErrors(t, []struct{ block, want string }{
		{`source "n" {
  kind    = "nats"
  url     = "nats://127.0.0.1:4222"
  stream  = "S"
  durable = "has space"
  output  = topic.in
}`, "Invalid durable"},
		{`source "n" {
  kind     = "nats"
  url      = "nats://127.0.0.1:4222"
  stream   = "S"
  durable  = "d"
  ack_wait = "10ms"
  output   = topic.in
}`, "Invalid ack_wait"},
		{`sink "n" {
  kind    = "nats"
  input   = topic.in
  url     = "127.0.0.1"
  subject = "x"
}`, "Invalid url"},
		{`sink "n" {
  kind    = "nats"
  input   = topic.in
  url     = "nats://h:4222"
  subject = "x"
  timeout = "0s"
}`, "Invalid timeout"},
		{`sink "n" {
  kind    = "nats"
  input   = topic.in
  url     = "nats://h:4222"
  subject = value.x
}`, "value"},
	})
}

// TestNATSHidesThePassword: a password in the url is a secret of the plan, and a sink whose
// server is away fails transiently, without it.
func TestNATSHidesThePassword(t *testing.T) {
	const url = "nats://flowrun:s3cret-pw@127.0.0.1:1"
	p := plan(t, fmt.Sprintf(`
sink "n" {
  kind    = "nats"
  input   = topic.in
  url     = %q
  subject = "out.${key}"
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
	defer made.(*natsSink).Close()
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

// TestNATSHeadersIn: a NATS message's headers become the message's, but for JetStream's own, and
// its trace context is taken apart.
func TestNATSHeadersIn(t *testing.T) {
	h := nats.Header{}
	h.Set("origin", "shop")
	h.Set("Nats-Msg-Id", "abc")
	h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.Set("tracestate", "k=v")
	headers, parent, state := fromNATSHeaders(h)
	if len(headers) != 1 || headers["origin"] != "shop" || parent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || state != "k=v" {
		t.Errorf("headers %v, traceparent %q, tracestate %q", headers, parent, state)
	}
}
