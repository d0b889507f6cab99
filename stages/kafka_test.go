package stages

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The kafka kinds without a broker: what validate refuses, and the headers' way in. Their proofs
// against kfake are in runtime (kafka_test.go, kafka_sink_test.go).

// TestKafkaValidates checks what validate says of the kinds' attributes.
func TestKafkaValidates(t *testing.T) {
	checkPlanErrors(t, []struct{ block, want string }{
		{`source "k" {
  kind    = "kafka"
  brokers = ["127.0.0.1"]
  topics  = ["orders"]
  group   = "g"
  output  = topic.in
}`, "Invalid brokers"},
		{`source "k" {
  kind    = "kafka"
  brokers = ["127.0.0.1:9092"]
  topics  = ["has space"]
  group   = "g"
  output  = topic.in
}`, "Invalid topics"},
		{`source "k" {
  kind         = "kafka"
  brokers      = ["127.0.0.1:9092"]
  topics       = ["orders"]
  group        = "g"
  start_offset = "middle"
  output       = topic.in
}`, "start_offset"},
		{`sink "k" {
  kind    = "kafka"
  input   = topic.in
  brokers = ["h:9092,h2"]
  topic   = "x"
}`, "Invalid brokers"},
		{`sink "k" {
  kind    = "kafka"
  input   = topic.in
  brokers = ["h:9092"]
  topic   = "x"
  timeout = "0s"
}`, "Invalid timeout"},
		{`sink "k" {
  kind    = "kafka"
  input   = topic.in
  brokers = ["h:9092"]
  topic   = value.x
}`, "value"},
	})
}

// TestKafkaHeadersIn: a record's headers become the message's (the first value of a key), and its
// trace context is taken apart.
func TestKafkaHeadersIn(t *testing.T) {
	headers, parent, state := fromKafkaHeaders([]kgo.RecordHeader{
		{Key: "origin", Value: []byte("shop")}, {Key: "origin", Value: []byte("again")},
		{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		{Key: "tracestate", Value: []byte("k=v")},
	})
	if len(headers) != 1 || headers["origin"] != "shop" || parent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || state != "k=v" {
		t.Errorf("headers %v, traceparent %q, tracestate %q", headers, parent, state)
	}
}

// TestKafkaBrokers: the brokers attribute's entries split at commas.
func TestKafkaBrokers(t *testing.T) {
	if got := kafkaBrokers([]string{"a:1, b:2", "c:3"}); strings.Join(got, " ") != "a:1 b:2 c:3" {
		t.Errorf("brokers %q", got)
	}
}
