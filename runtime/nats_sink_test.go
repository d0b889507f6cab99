package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/sqltest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
)

// The nats sink's proofs (see nats_test.go for the server they use): what it publishes is in
// JetStream once, a message JetStream refuses is dead-lettered with its reason, and a NATS that is
// away pauses the sink, dead-lettering nothing.

// natsSinkPipeline publishes topic "in" (4 partitions, keyed by msg.k) to NATS, on subject.
func natsSinkPipeline(prefix, delivery, url, subject string) string {
	return fmt.Sprintf(`
pipeline "natssink" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
sink "jet" {
  kind    = "nats"
  input   = topic.in
  url     = %q
  subject = %s
  timeout = "2s"
}
`, prefix, delivery, url, subject)
}

// publishIn publishes messages [from, to) to topic "in": {"i": i, "k": "k<i%10>"}, with the
// payload of extra where it says, and i's traceparent on every 10th.
func publishIn(t *testing.T, plan *flow.Plan, from, to int, extra func(int) string) {
	t.Helper()
	c := server.open(t)
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		more := ""
		if extra != nil {
			more = extra(i)
		}
		ctx := context.Background()
		if i%10 == 0 {
			ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": natsTraceparent(i)})
		}
		payload := fmt.Sprintf(`{"i":%d,"k":"k%d"%s}`, i, i%10, more)
		if err := pub.Publish(ctx, "in", stages.NewMessage("", []byte(payload), map[string]string{"origin": "test"})); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// natsStored reads every message of a stream: how many times each i is there, and checks their
// subjects, headers, trace context and Nats-Msg-Id (distinct).
func natsStored(t *testing.T, js jetstream.JetStream, stream string) map[int]int {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen, ids := map[int]int{}, map[string]bool{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream sequence %d: %v", seq, err)
		}
		var v struct {
			I int
			K string
		}
		if err := json.Unmarshal(m.Data, &v); err != nil {
			t.Fatalf("stream sequence %d: %v: %s", seq, err, m.Data)
		}
		if want := stream + ".out." + v.K; m.Subject != want {
			t.Fatalf("message %d on %s, want %s", v.I, m.Subject, want)
		}
		id := m.Header.Get("Nats-Msg-Id")
		if id == "" || ids[id] || m.Header.Get("origin") != "test" {
			t.Fatalf("message %d: Nats-Msg-Id %q (seen before: %v), headers %v", v.I, id, ids[id], m.Header)
		}
		ids[id] = true
		if tp := m.Header.Get("traceparent"); v.I%10 == 0 && tp != natsTraceparent(v.I) {
			t.Fatalf("message %d has traceparent %q, want %q", v.I, tp, natsTraceparent(v.I))
		}
		seen[v.I]++
	}
	return seen
}

// TestNATSSinkDeadLettersOnlyWhatJetStreamRefuses: of 1000 messages, every 97th is larger than
// the stream's max_msg_size and every 89th goes to a subject that no stream takes: only those are
// dead-lettered, each with JetStream's reason, and every other message is in the stream once.
func TestNATSSinkDeadLettersOnlyWhatJetStreamRefuses(t *testing.T) {
	const n = 1000
	big := func(i int) bool { return i%97 == 5 }
	lost := func(i int) bool { return i%89 == 7 && !big(i) }
	js := natsJS(t)
	stream := natsName(t)
	natsStream(t, js, stream, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 })
	subject := fmt.Sprintf(`msg.to == "nowhere" ? "%s_NONE.x" : "%s.out.${key}"`, stream, stream)
	plan := buildSource(t, natsSinkPipeline("ignored", "at_least_once", natsURL(), subject))
	publishIn(t, plan, 0, n, func(i int) string {
		switch {
		case big(i):
			return `,"to":"here","pad":"` + strings.Repeat("x", 2000) + `"`
		case lost(i):
			return `,"to":"nowhere"`
		}
		return `,"to":"here"`
	})
	c := server.open(t)
	runServiceUntil(t, c, plan, func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "jet") == n })
	stored := natsStored(t, js, stream)
	failing, bigs := 0, 0
	for i := 0; i < n; i++ {
		if big(i) || lost(i) {
			failing++
			if stored[i] != 0 {
				t.Errorf("message %d, refused, is in the stream", i)
			}
			delete(stored, i)
		}
		if big(i) {
			bigs++
		}
	}
	for i, k := range stored {
		if k != 1 {
			t.Errorf("message %d is in the stream %d times", i, k)
		}
	}
	if len(stored) != n-failing {
		t.Errorf("%d messages in the stream, want %d", len(stored), n-failing)
	}
	list := sinkDeadLetters(t, c, plan, "jet")
	if len(list) != failing {
		t.Fatalf("%d dead letters, want %d; the first: %q", len(list), failing, list[0].Envelope.Error)
	}
	var sizes, subjects int
	var examples [2]string
	for _, d := range list {
		switch p := string(d.Envelope.Payload); {
		case strings.Contains(p, `"pad"`) && strings.Contains(d.Envelope.Error, "maximum"):
			sizes++
			examples[0] = d.Envelope.Error
		case strings.Contains(p, `"nowhere"`) && strings.Contains(d.Envelope.Error, "no JetStream stream takes the subject "+stream+"_NONE.x"):
			subjects++
			examples[1] = d.Envelope.Error
		default:
			t.Errorf("a dead letter of %.60s says %q", p, d.Envelope.Error)
		}
	}
	if sizes != bigs || subjects != failing-bigs {
		t.Errorf("%d dead letters for size, %d for the subject; want %d and %d", sizes, subjects, bigs, failing-bigs)
	}
	t.Logf("%d messages in the stream, each once; %d dead letters: %d %q, %d %q", n-failing, len(list), sizes, examples[0], subjects, examples[1])
}

// TestNATSSinkWaitsOutAnOutage publishes through a TCP proxy in front of the server: once a
// first part is in the stream, the proxy resets every connection and refuses new ones while the
// rest is published to the topic. The sink pauses, probing, and once NATS is back publishes
// everything: nothing dead-lettered, each message in the stream once (what JetStream had taken
// before the cut and is published again, Nats-Msg-Id makes it store once).
func TestNATSSinkWaitsOutAnOutage(t *testing.T) {
	t.Parallel()
	const first, n = 500, 3000
	js := natsJS(t)
	stream := natsName(t)
	natsStream(t, js, stream, nil)
	proxy := sqltest.NewProxy(t, strings.TrimPrefix(natsURL(), "nats://"))
	plan := buildSource(t, natsSinkPipeline("ignored", "at_least_once", "nats://"+proxy.Addr(), fmt.Sprintf(`"%s.out.${key}"`, stream)))
	publishIn(t, plan, 0, first, nil)
	c := server.open(t)
	ctx, stop := context.WithCancel(context.Background())
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
		ended <- err
	}()
	var runErr error
	stopRun := sync.OnceFunc(func() {
		stop()
		runErr = <-ended
	})
	t.Cleanup(stopRun)
	count := func() int {
		total := 0
		for _, k := range natsStored(t, js, stream) {
			total += k
		}
		return total
	}
	waitFor(t, "the first part in the stream", func() bool { return count() == first })
	proxy.Cut()
	publishIn(t, plan, first, n, nil)
	waitFor(t, "the sink to try NATS while it is away", func() bool { return proxy.Refused() >= 3 })
	during := count()
	time.Sleep(500 * time.Millisecond)
	if got := count(); got != during {
		t.Fatalf("%d messages arrived while NATS was cut off", got-during)
	}
	if list := sinkDeadLetters(t, c, plan, "jet"); len(list) > 0 {
		t.Fatalf("%d dead letters while NATS was away, such as %q", len(list), list[0].Envelope.Error)
	}
	proxy.Restore()
	waitFor(t, "every message published and acknowledged", func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "jet") == n })
	stopRun()
	if runErr != nil {
		t.Fatalf("%v\n%s", runErr, log.String())
	}
	checkEachOnce(t, natsStored(t, js, stream), n)
	if list := sinkDeadLetters(t, c, plan, "jet"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	t.Logf("%d messages before the cut, %d while NATS was away (%d connections refused), each of %d once at the end", first, during, proxy.Refused(), n)
}

// TestNATSRoundTripKeepsSubjectOrder: 2000 messages published on ten subjects of one stream go
// through the source, a stage, and the sink to another stream, on the same subjects there
// (subject = the key, renamed): each arrives once, every subject's messages in their order, with
// the traceparent they were published with.
func TestNATSRoundTripKeepsSubjectOrder(t *testing.T) {
	const n = 2000
	js := natsJS(t)
	in, out := natsName(t), natsName(t)
	natsStream(t, js, in, nil)
	natsStream(t, js, out, nil)
	natsPublish(t, js, in, 0, n)
	plan := buildSource(t, natsRoundTripPipeline("", natsURL(), in, out, false))
	c := server.open(t)
	runServiceUntil(t, c, plan, func() bool { return acked(t, c, plan.KeyPrefix, "mark.out", 4, "jet_out") == n })
	// natsStored checks the subjects (out.out.k<i%10>: the key's last part), the trace context
	// and the distinct Nats-Msg-Ids; here the order of each subject's messages.
	checkEachOnce(t, natsStored(t, js, out), n)
	subjects := checkSubjectOrder(t, js, out, n)
	t.Logf("%d messages through source, stage and sink: each once, in order on each of %d subjects, traceparent kept", n, subjects)
}
