package stages

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The nats kinds without a server: what validate refuses, the password kept out of output, and
// the headers' way in; and the source's upstream lag against the machine's NATS server. Their
// proofs against a NATS server are in runtime (nats_test.go).

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

// lagEmitter is an Emitter for the nats source's lag test: it takes every message, says Redis
// has them up to the last one emitted only once written is set, and keeps the lags reported.
type lagEmitter struct {
	mu      sync.Mutex
	emitted int
	last    string // the last position emitted
	written bool   // whether Resume returns it
	away    bool   // whether Resume fails, as while Redis is away
	ids     map[string]int
	lags    []int64
}

func (e *lagEmitter) Emit(_ context.Context, _ Message, at Origin) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.emitted++
	e.last = at.Position
	if e.ids == nil {
		e.ids = map[string]int{}
	}
	e.ids[at.ID]++
	return nil
}
func (e *lagEmitter) EmitAll(context.Context, []Message, []Origin) ([]string, error) {
	panic("not used")
}
func (e *lagEmitter) Reject(context.Context, error, Message, Origin) error { panic("not used") }
func (e *lagEmitter) Record(context.Context, string) error                 { return nil }
func (e *lagEmitter) Resume(context.Context) (string, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.away {
		return "", false, errors.New("redis away")
	}
	return e.last, e.written && e.last != "", nil
}
func (e *lagEmitter) ReportLag(n int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lags = append(e.lags, n)
}

// latest returns the last lag reported and how many were, and how many messages were emitted.
func (e *lagEmitter) latest() (lag int64, reports, emitted int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.lags) == 0 {
		return -1, 0, e.emitted
	}
	return e.lags[len(e.lags)-1], len(e.lags), e.emitted
}

// natsServerJS connects to the machine's NATS server (FLOWRUN_NATS_URL, default
// nats://127.0.0.1:4222) and makes a stream of the test's own, deleted after, taking the subjects
// <stream>.>; publish publishes messages [from, to), {"i": i}, on three of them.
func natsServerJS(t *testing.T, ctx context.Context) (url, stream string, js jetstream.JetStream, publish func(from, to int)) {
	t.Helper()
	url = os.Getenv("FLOWRUN_NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("this test needs a NATS server with JetStream at %s (FLOWRUN_NATS_URL): %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream = fmt.Sprintf("FLOWRUN_STAGES_%d_%d", os.Getpid(), time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	publish = func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, fmt.Sprintf("%s.k%d", stream, i%3), fmt.Appendf(nil, `{"i":%d}`, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return url, stream, js, publish
}

// startNATSSource starts the nats source of block (a source "jet" block of format's, given url
// and stream) on out, which the test's end stops.
func startNATSSource(t *testing.T, ctx context.Context, block, url, stream string, out Emitter) {
	t.Helper()
	p := plan(t, fmt.Sprintf(block, url, stream))
	s := p.Sources[len(p.Sources)-1] // plan's first is a stdin source
	if s.Name != "jet" {
		t.Fatalf("the plan's last source is %q", s.Name)
	}
	k, _ := SourceKindOf(s)
	src, err := k.New(s, Env{Pipeline: "t"})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ended := make(chan error, 1)
	go func() { ended <- src.Produce(runCtx, out) }()
	t.Cleanup(func() {
		stop()
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Errorf("the source ended with %v, want the context's end", err)
		}
	})
}

// TestNATSSourceReportsItsConsumersPending runs the nats source on the machine's NATS server
// (FLOWRUN_NATS_URL, default nats://127.0.0.1:4222), in a stream of its own, with an Emitter that
// holds every message back from Redis, then lets them through: the lag it reports is the durable
// consumer's NumPending + NumAckPending as JetStream says it: 50, with 10 delivered (max_ack_pending)
// and 40 not; 70 once 20 more are published; 0 once Redis has everything and the source acknowledged it.
func TestNATSSourceReportsItsConsumersPending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, stream, js, publish := natsServerJS(t, ctx)
	publish(0, 50)

	out := &lagEmitter{}
	startNATSSource(t, ctx, `
source "jet" {
  kind            = "nats"
  url             = %q
  stream          = %q
  durable         = "lag"
  max_ack_pending = 10
  output          = topic.in
}
`, url, stream, out)

	// pending asks JetStream for the consumer's counts; -1 before the source created it.
	pending := func() (int64, *jetstream.ConsumerInfo) {
		cons, err := js.Consumer(ctx, stream, "lag")
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return -1, &jetstream.ConsumerInfo{}
		}
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return int64(info.NumPending) + int64(info.NumAckPending), info
	}
	// settle waits until the source has reported want, after JetStream's counts are want: a
	// report of the consumer as it then is.
	settle := func(what string, want int64, emitted int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, info := pending()
			lag, reports, n := out.latest()
			if got == want && lag == want && n == emitted {
				t.Logf("%s: lag %d reported (%d reports); JetStream: NumPending %d, NumAckPending %d", what, lag, reports, info.NumPending, info.NumAckPending)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: lag %d reported (%d reports), %d emitted; JetStream: NumPending %d, NumAckPending %d; want %d and %d emitted",
					what, lag, reports, n, info.NumPending, info.NumAckPending, want, emitted)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	settle("nothing in Redis", 50, 10)
	publish(50, 70)
	settle("20 more published", 70, 10)
	out.mu.Lock()
	out.written = true
	out.mu.Unlock()
	settle("everything in Redis", 0, 70)
}

// TestNATSSourceExtendsWhileRedisIsAway: while Redis does not answer (the Emitter's Resume fails),
// the source asks JetStream for more time for the messages it emitted, so that JetStream does not
// deliver them again: after more than twice ack_wait (2s; five lag reports, one a second), each
// was emitted once and JetStream has redelivered none.
func TestNATSSourceExtendsWhileRedisIsAway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, stream, js, publish := natsServerJS(t, ctx)
	publish(0, 30)
	out := &lagEmitter{away: true}
	startNATSSource(t, ctx, `
source "jet" {
  kind     = "nats"
  url      = %q
  stream   = %q
  durable  = "away"
  ack_wait = "2s"
  output   = topic.in
}
`, url, stream, out)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, reports, _ := out.latest(); reports >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the source did not report its lag five times in 30s")
		}
	}
	cons, err := js.Consumer(ctx, stream, "away")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if info.NumRedelivered != 0 || len(out.ids) != 30 || out.emitted != 30 {
		t.Errorf("JetStream redelivered %d messages; %d emitted, %d distinct: want none redelivered, each of 30 once",
			info.NumRedelivered, out.emitted, len(out.ids))
	}
	t.Logf("%d messages waiting for Redis through %d lag reports: none redelivered (NumAckPending %d)", out.emitted, len(out.lags), info.NumAckPending)
}
