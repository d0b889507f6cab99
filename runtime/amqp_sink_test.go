package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/flowrun/flowrun/internal/sqltest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
)

// The amqp sink's proofs (see amqp_test.go for the broker they use): what it publishes reaches the
// queue, with a message_id per entry, a message the broker refuses is dead-lettered with its
// reason, and a broker that is away pauses the sink, dead-lettering nothing.

// amqpSinkPipeline publishes topic "in" (4 partitions, keyed by msg.k) to the broker at url.
func amqpSinkPipeline(prefix, delivery, url, exchange, routingKey string) string {
	return fmt.Sprintf(`
pipeline "amqpsink" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
sink "rabbit" {
  kind        = "amqp"
  input       = topic.in
  url         = %q
  exchange    = %s
  routing_key = %s
  timeout     = "2s"
}
`, prefix, delivery, url, exchange, routingKey)
}

// amqpOut is a message read back from a queue.
type amqpOut struct {
	I     int
	K     string
	Key   string // routing key
	ID    string // message_id
	Trace string
}

// amqpTake takes every message from the queue (auto-acknowledged), in the queue's order, and
// checks each one's headers and message_id.
func amqpTake(t testing.TB, url, queue string) []amqpOut {
	t.Helper()
	ch := amqpClient(t, url)
	var out []amqpOut
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		var v amqpOut
		if err := json.Unmarshal(d.Body, &v); err != nil {
			t.Fatalf("%v: %s", err, d.Body)
		}
		v.Key, v.ID = d.RoutingKey, d.MessageId
		if tp, ok := d.Headers["traceparent"].(string); ok {
			v.Trace = tp
		}
		if d.Headers["origin"] != "test" || v.ID == "" || d.ContentType != "application/json" || d.DeliveryMode != amqp.Persistent {
			t.Fatalf("message %d: headers %v, message_id %q, content type %q, delivery mode %d", v.I, d.Headers, v.ID, d.ContentType, d.DeliveryMode)
		}
		out = append(out, v)
	}
}

// amqpDistinct checks that each copy of a message has the same message_id, and no two messages
// share one; it returns how many times each message is there, counting its copies (as a consumer
// that drops a message_id seen before does) once.
func amqpDistinct(t testing.TB, got []amqpOut) map[int]int {
	t.Helper()
	ids, byID := map[int]string{}, map[string]int{}
	seen := map[int]int{}
	for _, m := range got {
		if id, ok := ids[m.I]; ok && id != m.ID {
			t.Fatalf("message %d is there with the message_ids %q and %q", m.I, id, m.ID)
		}
		if i, ok := byID[m.ID]; ok && i != m.I {
			t.Fatalf("messages %d and %d share the message_id %q", i, m.I, m.ID)
		}
		if _, ok := ids[m.I]; !ok {
			seen[m.I]++
		}
		ids[m.I], byID[m.ID] = m.ID, m.I
	}
	return seen
}

// TestAMQPSinkDeadLettersOnlyWhatTheBrokerRefuses: of 1000 messages, every 89th goes to an
// exchange that does not exist, every 97th with a routing key no queue is bound by (mandatory: the
// broker returns it), and every 83rd to a queue that is full and rejects what is published
// (x-max-length 0, x-overflow reject-publish: the broker nacks it). Only those are dead-lettered,
// each with the broker's reason, and every other message is in the queue once, in each key's order.
func TestAMQPSinkDeadLettersOnlyWhatTheBrokerRefuses(t *testing.T) {
	const n = 1000
	lost := func(i int) bool { return i%89 == 7 }
	unroutable := func(i int) bool { return i%97 == 5 && !lost(i) }
	full := func(i int) bool { return i%83 == 3 && !lost(i) && !unroutable(i) }
	name := amqpName(t)
	amqpQueue(t, amqpURL(), name, nil)
	amqpQueue(t, amqpURL(), name+"full", amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	ch := amqpClient(t, amqpURL())
	if err := ch.QueueBind(name+"full", "full.#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	plan := buildSource(t, amqpSinkPipeline("ignored", "at_least_once", amqpURL(),
		fmt.Sprintf(`msg.to == "nowhere" ? "%s.none" : "%s"`, name, name),
		fmt.Sprintf(`msg.to == "unbound" ? "unbound.${key}" : msg.to == "full" ? "full.${key}" : "%s.out.${key}"`, name)))
	publishIn(t, plan, 0, n, func(i int) string {
		switch {
		case lost(i):
			return `,"to":"nowhere"`
		case unroutable(i):
			return `,"to":"unbound"`
		case full(i):
			return `,"to":"full"`
		}
		return `,"to":"here"`
	})
	c := server.open(t)
	runServiceUntil(t, c, plan, func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "rabbit") == n })
	got := amqpTake(t, amqpURL(), name)
	stored := amqpDistinct(t, got)
	want := map[string]int{}
	for i := 0; i < n; i++ {
		switch {
		case lost(i):
			want["nowhere"]++
		case unroutable(i):
			want["unbound"]++
		case full(i):
			want["full"]++
		default:
			if stored[i] != 1 {
				t.Errorf("message %d is in the queue %d times", i, stored[i])
			}
			continue
		}
		if stored[i] != 0 {
			t.Errorf("message %d, refused, is in the queue", i)
		}
	}
	if len(stored) != n-want["nowhere"]-want["unbound"]-want["full"] {
		t.Errorf("%d messages in the queue, want %d", len(stored), n-want["nowhere"]-want["unbound"]-want["full"])
	}
	checkKeyOrder(t, got, func(m amqpOut) bool { return m.Key == name+".out."+m.K })
	reasons := map[string]string{
		"nowhere": fmt.Sprintf("no exchange %q on the broker: 404 NOT_FOUND", name+".none"),
		"unbound": "the broker returned the message published to exchange",
		"full":    "the broker refused (basic.nack)",
	}
	list := sinkDeadLetters(t, c, plan, "rabbit")
	counts, examples := map[string]int{}, map[string]string{}
	for _, d := range list {
		var v struct{ To string }
		_ = json.Unmarshal(d.Envelope.Payload, &v)
		if !strings.Contains(d.Envelope.Error, reasons[v.To]) || reasons[v.To] == "" {
			t.Errorf("a dead letter of %.60s says %q", d.Envelope.Payload, d.Envelope.Error)
		}
		counts[v.To]++
		examples[v.To] = d.Envelope.Error
	}
	for to, k := range want {
		if counts[to] != k {
			t.Errorf("%d dead letters of messages to %s, want %d", counts[to], to, k)
		}
	}
	t.Logf("%d messages in the queue, each once; dead letters: %v, such as %q", len(got), counts, examples)
}

// TestAMQPSinkWaitsOutAnOutage publishes through a TCP proxy in front of the broker: once a first
// part is in the queue, the proxy resets every connection and refuses new ones while the rest is
// published to the topic. The sink pauses, probing, and once the broker is back publishes
// everything: nothing dead-lettered, each message in the queue (a message the broker had taken
// before the cut but not confirmed is there twice, with the same message_id).
func TestAMQPSinkWaitsOutAnOutage(t *testing.T) {
	t.Parallel()
	const first, n = 500, 3000
	name := amqpName(t)
	amqpQueue(t, amqpURL(), name, nil)
	proxy := sqltest.NewProxy(t, amqpHost())
	plan := buildSource(t, amqpSinkPipeline("ignored", "at_least_once", amqpVia(proxy.Addr()), fmt.Sprintf("%q", name), fmt.Sprintf(`"%s.out.${key}"`, name)))
	publishIn(t, plan, 0, first, nil)
	c := server.open(t)
	run := runInBackground(t, plan, runtime.Options{Redis: c})
	waitFor(t, "the first part in the queue", func() bool { return amqpDepth(t, amqpURL(), name) == first })
	proxy.Cut()
	publishIn(t, plan, first, n, nil)
	waitFor(t, "the sink to try the broker while it is away", func() bool { return proxy.Refused() >= 3 })
	during := amqpDepth(t, amqpURL(), name)
	time.Sleep(500 * time.Millisecond)
	if got := amqpDepth(t, amqpURL(), name); got != during {
		t.Fatalf("%d messages arrived while the broker was cut off", got-during)
	}
	if list := sinkDeadLetters(t, c, plan, "rabbit"); len(list) > 0 {
		t.Fatalf("%d dead letters while the broker was away, such as %q", len(list), list[0].Envelope.Error)
	}
	proxy.Restore()
	waitFor(t, "every message published and acknowledged", func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "rabbit") == n })
	stopClean(t, run)
	got := amqpTake(t, amqpURL(), name)
	checkEachOnce(t, amqpDistinct(t, got), n)
	if list := sinkDeadLetters(t, c, plan, "rabbit"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	t.Logf("%d messages before the cut, %d while the broker was away (%d connections refused); %d in the queue at the end, %d distinct message_ids",
		first, during, proxy.Refused(), len(got), n)
}

// amqpRoundTrip is a pipeline from the queue in, through a stage, to the exchange out (routing
// keys out.out.k<i%10>, renamed from in's), with delivery.
func amqpRoundTrip(prefix, delivery, url, in, out string) string {
	return fmt.Sprintf(`
pipeline "amqproundtrip" {
  key_prefix = %[1]q
  delivery   = %[2]q
}
topic "in" {
  partitions = 4
}
source "rabbit" {
  kind        = "amqp"
  url         = %[3]q
  queue       = %[4]q
  exchange    = %[4]q
  binding_key = "%[4]s.#"
  output      = topic.in
}
stage "mark" {
  kind  = "map"
  input = topic.in
  set   = { k = "k${msg.i %% 10}", via = "flowrun" }
}
stage "check" {
  kind  = "filter"
  input = stage.mark
  where = msg.via == "flowrun"
}
sink "rabbit_out" {
  kind        = "amqp"
  input       = stage.check
  url         = %[3]q
  exchange    = %[5]q
  routing_key = "%[5]s.out.${trimprefix(key, "%[4]s.")}"
}
`, prefix, delivery, url, in, out)
}

// TestAMQPRoundTripCarriesTheTrace: with tracing on, 500 messages published to a queue, every
// 10th with a traceparent, go through the source, two stages and the sink to another queue: each
// arrives once, in each routing key's order, and each traced one with a traceparent of the same
// trace whose parent is a span the pipeline made in it: a child of the trace it came with.
func TestAMQPRoundTripCarriesTheTrace(t *testing.T) {
	const n = 500
	in, out := amqpName(t), amqpName(t)
	amqpQueue(t, amqpURL(), in, nil)
	amqpQueue(t, amqpURL(), out, nil)
	amqpPublish(t, amqpClient(t, amqpURL()), in, 0, n, true)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	plan := buildSource(t, amqpRoundTrip("ignored", "effectively_once", amqpURL(), in, out))
	c := server.open(t)
	run := runInBackground(t, plan, runtime.Options{Redis: c, TracerProvider: tp})
	waitFor(t, "every message in the out queue", func() bool { return stillRunning(t, run) && amqpDepth(t, amqpURL(), out) >= n })
	stopClean(t, run)
	got := amqpTake(t, amqpURL(), out)
	checkEachOnce(t, amqpDistinct(t, got), n)
	spans := map[string]string{} // span ID: its trace ID
	for _, s := range rec.Ended() {
		spans[s.SpanContext().SpanID().String()] = s.SpanContext().TraceID().String()
	}
	keys := checkKeyOrder(t, got, func(m amqpOut) bool { return m.Key == out+".out.k"+fmt.Sprint(m.I%10) })
	traced := 0
	for _, m := range got {
		if m.I%10 != 0 {
			continue
		}
		sent := natsTraceparent(m.I)
		if len(m.Trace) != 55 || m.Trace[3:35] != sent[3:35] || m.Trace[36:52] == sent[36:52] || spans[m.Trace[36:52]] != sent[3:35] {
			t.Errorf("message %d came out with traceparent %q, want a child in the trace of %q", m.I, m.Trace, sent)
		}
		traced++
	}
	t.Logf("%d messages through source, two stages and sink: each once, in order on each of %d routing keys; %d traced ones out with a child of their trace, such as %q",
		n, keys, traced, got[0].Trace)
}

// checkKeyOrder checks that each message read from a queue has the routing key it should have
// (right), and that each routing key's messages are in the order published, counting the first
// copy of each; it returns how many routing keys there are.
func checkKeyOrder(t testing.TB, got []amqpOut, right func(amqpOut) bool) int {
	t.Helper()
	last, seen := map[string]int{}, map[int]bool{}
	for _, m := range got {
		if !right(m) {
			t.Fatalf("message %d has the routing key %q", m.I, m.Key)
		}
		if seen[m.I] {
			continue
		}
		seen[m.I] = true
		if prev, ok := last[m.Key]; ok && m.I < prev {
			t.Fatalf("routing key %s: message %d after %d", m.Key, m.I, prev)
		}
		last[m.Key] = m.I
	}
	return len(last)
}

// stallProxy forwards TCP connections to target until stall: from then on, the connections it
// has stop being read and written, without being closed (a broker that hangs, or blocks its
// publishers); new connections are forwarded.
type stallProxy struct {
	ln      net.Listener
	mu      sync.Mutex
	stalled chan struct{} // closed by stall, for the connections made before
	release chan struct{} // closed when the test ends
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, stalled: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { _ = ln.Close(); close(p.release) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			stalled := p.stalled
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				defer func() { _ = dst.Close(); _ = src.Close() }()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					select {
					case <-stalled:
						<-p.release
						return
					default:
					}
					if err != nil {
						return
					}
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return p
}

// stall stops the connections made so far.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.stalled)
	p.stalled = make(chan struct{})
}

// TestAMQPSinkLeavesAHungConnection: a broker that stops reading (here a proxy that stops
// forwarding, without closing) holds a publication forever: the sink's watchdog closes the
// connection past its timeout, the batch fails transiently instead of hanging, and the next batch
// goes through on a new connection.
func TestAMQPSinkLeavesAHungConnection(t *testing.T) {
	t.Parallel()
	name := amqpName(t)
	amqpQueue(t, amqpURL(), name, nil)
	proxy := newStallProxy(t, amqpHost())
	plan := buildSource(t, strings.Replace(amqpSinkPipeline("ignored", "at_least_once", amqpVia(proxy.ln.Addr().String()), `""`, fmt.Sprintf("%q", name)),
		`timeout     = "2s"`, `timeout     = "1s"`, 1))
	kind, err := stages.SinkKindOf(plan.Sinks[0])
	if err != nil {
		t.Fatal(err)
	}
	made, err := kind.New(plan.Sinks[0], stages.Env{Pipeline: "t"})
	if err != nil {
		t.Fatal(err)
	}
	sink := made.(stages.BatchSink)
	// Not waited for: a DeliverBatch that hangs (the watchdog broken) holds Close too.
	defer func() { go func() { _ = made.(interface{ Close() error }).Close() }() }()
	batch := func(n, size int) []stages.Delivery {
		d := make([]stages.Delivery, n)
		for i := range d {
			m := stages.NewMessage("k", fmt.Appendf(nil, `{"i":%d,"pad":%q}`, i, strings.Repeat("x", size)), map[string]string{"origin": "test"})
			d[i] = stages.Delivery{Message: &m, ID: fmt.Sprintf("%d-0", i)}
		}
		return d
	}
	deliver := func(d []stages.Delivery) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			sink.DeliverBatch(ctx, d)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatal("DeliverBatch hangs on a connection the broker does not read")
		}
	}
	first := batch(10, 10)
	deliver(first)
	for _, d := range first {
		if d.Err != nil {
			t.Fatalf("before the stall: %v", d.Err)
		}
	}
	proxy.stall()
	big := batch(2000, 10<<10) // 20 MB: more than the sockets' buffers take
	deliver(big)
	failed := 0
	for _, d := range big {
		if d.Err != nil {
			if !stages.IsTransient(d.Err) {
				t.Fatalf("a publication on the hung connection: %v, want a transient error", d.Err)
			}
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("every publication on the hung connection succeeded")
	}
	again := batch(10, 10)
	deliver(again)
	for _, d := range again {
		if d.Err != nil {
			t.Fatalf("after the stall, on a new connection: %v", d.Err)
		}
	}
	t.Logf("%d of %d publications on the hung connection failed transiently, such as %v; the next batch went through", failed, len(big), big[len(big)-1].Err)
}
