package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flowrun/internal/sqltest"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The nats source's and sink's proofs run on the machine's NATS server with JetStream
// (FLOWRUN_NATS_URL, default nats://127.0.0.1:4222), which others use too: each test makes streams
// and consumers of its own names and deletes them after, and an outage is a TCP proxy of the test's
// own in front of the server (sqltest.Proxy), never the server stopped.

// natsURL is the machine's NATS server.
func natsURL() string {
	if u := os.Getenv("FLOWRUN_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// natsJS connects the test to the NATS server.
func natsJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(natsURL())
	if err != nil {
		t.Fatalf("the tests of the nats kinds need a NATS server with JetStream at %s (FLOWRUN_NATS_URL): %v", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// natsStream creates a stream of the test's own, named name, taking the subjects name.>, which is
// deleted when the test ends; cfg may change its configuration.
func natsStream(t *testing.T, js jetstream.JetStream, name string, cfg func(*jetstream.StreamConfig)) {
	t.Helper()
	sc := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}
	if cfg != nil {
		cfg(&sc)
	}
	if _, err := js.CreateStream(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) }) // its consumers go with it
}

// natsName is a name for a test's stream, unique to this run of the test.
func natsName(t *testing.T) string {
	return fmt.Sprintf("FLOWRUN_%s_%d_%d", strings.ToUpper(strings.NewReplacer("/", "_", "-", "_").Replace(t.Name())), os.Getpid(), prefixes.Add(1))
}

// natsPublish publishes messages [from, to) of the source tests to stream on the subjects
// stream.k0 to stream.k9, i's payload {"i": i}, with a header origin: test; every 10th carries a
// traceparent.
func natsPublish(t *testing.T, js jetstream.JetStream, stream string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		m := nats.NewMsg(fmt.Sprintf("%s.k%d", stream, i%10))
		m.Data = fmt.Appendf(nil, `{"i":%d}`, i)
		m.Header.Set("origin", "test")
		if i%10 == 0 {
			m.Header.Set("traceparent", natsTraceparent(i))
		}
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("JetStream did not confirm the test's publications")
	}
}

// natsTraceparent is the trace context that message i carries in.
func natsTraceparent(i int) string {
	return fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)
}

// natsSourcePipeline reads stream into topic "in" (4 partitions, keyed by the subject).
func natsSourcePipeline(prefix, delivery, stream string) string {
	return natsSourcePipelineVia(prefix, delivery, natsURL(), stream)
}

// natsSourcePipelineVia is natsSourcePipeline through the server at url.
func natsSourcePipelineVia(prefix, delivery, url, stream string) string {
	return fmt.Sprintf(`
pipeline "natssource" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
}
source "jet" {
  kind     = "nats"
  url      = %q
  stream   = %q
  durable  = "flowrun"
  ack_wait = "2s"
  output   = topic.in
}
`, prefix, delivery, url, stream)
}

// natsTopic reads topic "in": how many times each message i is there, and checks each entry's key
// (its subject), its headers and, for every 10th, its trace context.
func natsTopic(t *testing.T, c *redis.Client, prefix, stream string) map[int]int {
	t.Helper()
	seen := map[int]int{}
	for _, s := range (redis.Keys{Prefix: prefix}).Streams("in", 4) {
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
				if want := fmt.Sprintf("%s.k%d", stream, m.I%10); r.Key != want {
					t.Fatalf("message %d has key %q, want its subject %q", m.I, r.Key, want)
				}
				if r.Headers["origin"] != "test" {
					t.Fatalf("message %d has headers %v, want the NATS header origin: test", m.I, r.Headers)
				}
				if m.I%10 == 0 && r.TraceParent != natsTraceparent(m.I) {
					t.Fatalf("message %d has traceparent %q, want %q", m.I, r.TraceParent, natsTraceparent(m.I))
				}
				seen[m.I]++
			}
		}
	}
	return seen
}

// checkEachOnce checks that messages [0, n) are each there once, and nothing else.
func checkEachOnce(t *testing.T, seen map[int]int, n int) {
	t.Helper()
	total := 0
	for i, k := range seen {
		total += k
		if i < 0 || i >= n || k != 1 {
			t.Errorf("message %d is there %d times", i, k)
		}
	}
	if len(seen) != n || total != n {
		t.Errorf("%d distinct messages in %d entries, want %d", len(seen), total, n)
	}
}

// TestNATSSourceWritesEachMessageOnce: 3000 messages published to a stream, half before the run
// and half during it, are each in the topic once, keyed by their subjects, with the trace context
// they came with; and once Redis has them, JetStream has every one acknowledged.
func TestNATSSourceWritesEachMessageOnce(t *testing.T) {
	const n = 3000
	js := natsJS(t)
	stream := natsName(t)
	natsStream(t, js, stream, nil)
	natsPublish(t, js, stream, 0, n/2)
	c := server.open(t)
	plan := buildSource(t, natsSourcePipeline("ignored", "at_least_once", stream))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
		ended <- err
	}()
	natsPublish(t, js, stream, n/2, n)
	entries := func() int {
		total := 0
		for _, k := range natsTopic(t, c, plan.KeyPrefix, stream) {
			total += k
		}
		return total
	}
	waitFor(t, "every message in the topic", func() bool {
		select {
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		default:
		}
		return entries() >= n
	})
	var info *jetstream.ConsumerInfo
	waitFor(t, "JetStream to have every message acknowledged", func() bool {
		cons, err := js.Consumer(ctx, stream, "flowrun")
		if err != nil {
			t.Fatal(err)
		}
		if info, err = cons.Info(ctx); err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == n
	})
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	checkEachOnce(t, natsTopic(t, c, plan.KeyPrefix, stream), n)
	t.Logf("%d messages, each once in the topic; JetStream's ack floor: stream sequence %d, %d redelivered",
		n, info.AckFloor.Stream, info.NumRedelivered)
}

// TestNATSSourceNeedsItsStream: a source whose stream does not exist ends the run, naming it.
func TestNATSSourceNeedsItsStream(t *testing.T) {
	natsJS(t) // the server is there
	stream := natsName(t)
	plan := buildSource(t, natsSourcePipeline("ignored", "at_least_once", stream))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var log syncBuffer
	_, err := runtime.Run(ctx, plan, runtime.Options{Redis: server.open(t), Logger: newLogger(&log)})
	if err == nil || !strings.Contains(err.Error(), `no JetStream stream "`+stream+`"`) {
		t.Fatalf("the run ended with %v, want the missing stream named\n%s", err, log.String())
	}
	t.Logf("the run ended: %v", err)
}

// TestNATSSourceWaitsOutAnOutage reads through a TCP proxy in front of the server: once a first
// part is in the topic, the proxy resets every connection and refuses new ones while the rest is
// published (to the server itself). Nothing arrives meanwhile; once NATS is back, every message is
// in the topic once (effectively-once: what was delivered and not acknowledged before the cut is
// delivered again).
func TestNATSSourceWaitsOutAnOutage(t *testing.T) {
	t.Parallel()
	const first, n = 1000, 3000
	js := natsJS(t)
	stream := natsName(t)
	natsStream(t, js, stream, nil)
	proxy := sqltest.NewProxy(t, strings.TrimPrefix(natsURL(), "nats://"))
	c := server.open(t)
	plan := buildSource(t, natsSourcePipelineVia("ignored", "effectively_once", "nats://"+proxy.Addr(), stream))
	natsPublish(t, js, stream, 0, first)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
		ended <- err
	}()
	entries := func() int {
		total := 0
		for _, k := range natsTopic(t, c, plan.KeyPrefix, stream) {
			total += k
		}
		return total
	}
	waitFor(t, "the first part in the topic", func() bool { return entries() == first })
	proxy.Cut()
	natsPublish(t, js, stream, first, n)
	waitFor(t, "the source to try NATS while it is away", func() bool { return proxy.Refused() >= 3 })
	if got := entries(); got != first {
		t.Fatalf("%d entries while NATS was cut off, want %d", got, first)
	}
	proxy.Restore()
	waitFor(t, "every message in the topic", func() bool {
		select {
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		default:
		}
		return entries() >= n
	})
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	checkEachOnce(t, natsTopic(t, c, plan.KeyPrefix, stream), n)
	t.Logf("%d messages before the cut, %d connections refused while NATS was away, each of %d once at the end", first, proxy.Refused(), n)
}
