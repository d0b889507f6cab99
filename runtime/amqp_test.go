package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/flowrun/flowrun/internal/sqltest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The amqp source's and sink's proofs run on the machine's RabbitMQ (FLOWRUN_AMQP_URL, default
// amqp://guest:guest@127.0.0.1:5672/), which others use too: each test declares queues and
// exchanges of its own names and deletes them after, and an outage is a TCP proxy of the test's
// own in front of the broker (sqltest.Proxy), never the broker stopped. The outside client is
// amqp091-go itself: the machine's rabbitmqadmin needs the management plugin, which is not enabled.

// amqpURL is the machine's RabbitMQ.
func amqpURL() string {
	if u := os.Getenv("FLOWRUN_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// amqpVia is amqpURL through the proxy at addr.
func amqpVia(addr string) string {
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		panic(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		panic(err)
	}
	u.Host = host
	if u.Port, err = strconv.Atoi(port); err != nil {
		panic(err)
	}
	return u.String()
}

// amqpHost is the host:port of amqpURL.
func amqpHost() string {
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s:%d", u.Host, u.Port)
}

// amqpClient is the test's own connection to a broker: a channel in confirm mode.
func amqpClient(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("the tests of the amqp kinds need RabbitMQ at %s (FLOWRUN_AMQP_URL): %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}

// amqpName is a name for a test's queue or exchange, unique to this run of the test.
func amqpName(t *testing.T) string {
	return fmt.Sprintf("flowrun.%s.%d.%d", strings.NewReplacer("/", "_").Replace(t.Name()), os.Getpid(), prefixes.Add(1))
}

// amqpQueue declares, on the broker at url, a topic exchange name and a durable queue name bound
// to it with name.#, which are deleted when the test ends.
func amqpQueue(t *testing.T, url, name string, args amqp.Table) {
	t.Helper()
	ch := amqpClient(t, url)
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, name+".#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch := amqpClient(t, url)
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
}

// amqpPublish publishes messages [from, to) of the source tests to the exchange name with the
// routing keys name.k0 to name.k9, i's payload {"i": i}, a header origin: test, message_id m<i>
// when ids, and i's traceparent on every 10th; and waits for the broker to confirm them.
func amqpPublish(t testing.TB, ch *amqp.Channel, name string, from, to int, ids bool) {
	t.Helper()
	var confirms []*amqp.DeferredConfirmation
	for i := from; i < to; i++ {
		msg := amqp.Publishing{Body: fmt.Appendf(nil, `{"i":%d}`, i), DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"origin": "test"}}
		if ids {
			msg.MessageId = fmt.Sprintf("m%d", i)
		}
		if i%10 == 0 {
			msg.Headers["traceparent"] = natsTraceparent(i)
		}
		d, err := ch.PublishWithDeferredConfirm(name, fmt.Sprintf("%s.k%d", name, i%10), true, false, msg)
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, d)
	}
	for _, d := range confirms {
		if !d.Wait() {
			t.Fatal("the broker did not confirm a test publication")
		}
	}
}

// amqpDepth is how many messages the queue holds ready.
func amqpDepth(t testing.TB, url, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// amqpSourcePipeline reads queue (bound to the exchange of the same name) into topic "in" (4
// partitions, keyed by the routing key), through the broker at url.
func amqpSourcePipeline(prefix, delivery, url, queue string) string {
	return fmt.Sprintf(`
pipeline "amqpsource" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
}
source "rabbit" {
  kind        = "amqp"
  url         = %q
  queue       = %[4]q
  exchange    = %[4]q
  binding_key = "%[4]s.#"
  prefetch    = 500
  output      = topic.in
}
`, prefix, delivery, url, queue)
}

// amqpTopic reads topic "in": how many times each message i is there; and checks each entry's key
// (its routing key), its headers, for every 10th its trace context, and that each key's messages
// are in the order published (the first time each is there).
func amqpTopic(t *testing.T, c *redis.Client, prefix, name string) map[int]int {
	t.Helper()
	seen := map[int]int{}
	last := map[string]int{}
	for _, s := range (redis.Keys{Prefix: prefix}).Streams("in", 4) {
		for _, r := range readAll(t, c, s) {
			var m struct{ I int }
			if err := json.Unmarshal(r.Payload, &m); err != nil {
				t.Fatalf("entry %s: %v", r.ID, err)
			}
			if want := fmt.Sprintf("%s.k%d", name, m.I%10); r.Key != want {
				t.Fatalf("message %d has key %q, want its routing key %q", m.I, r.Key, want)
			}
			if r.Headers["origin"] != "test" {
				t.Fatalf("message %d has headers %v, want the AMQP header origin: test", m.I, r.Headers)
			}
			if m.I%10 == 0 && r.TraceParent != natsTraceparent(m.I) {
				t.Fatalf("message %d has traceparent %q, want %q", m.I, r.TraceParent, natsTraceparent(m.I))
			}
			if prev, ok := last[r.Key]; ok && seen[m.I] == 0 && m.I < prev {
				t.Fatalf("key %s: message %d after %d", r.Key, m.I, prev)
			}
			last[r.Key] = max(last[r.Key], m.I)
			seen[m.I]++
		}
	}
	return seen
}

// amqpEntries is how many entries topic "in" holds.
func amqpEntries(t *testing.T, c *redis.Client, prefix string) int64 {
	t.Helper()
	var total int64
	for _, s := range (redis.Keys{Prefix: prefix}).Streams("in", 4) {
		l, err := c.Universal().XLen(context.Background(), s).Result()
		if err != nil {
			t.Fatal(err)
		}
		total += l
	}
	return total
}

// stillRunning fails the test if the run has ended by itself.
func stillRunning(t *testing.T, r *bgRun) bool {
	t.Helper()
	select {
	case <-r.done:
		t.Fatalf("the run ended: %v\n%s", r.err, r.log.String())
	default:
	}
	return true
}

// stopClean stops the run and fails the test if it ended with an error.
func stopClean(t *testing.T, r *bgRun) {
	t.Helper()
	if err := r.stop(); err != nil {
		t.Fatalf("%v\n%s", err, r.log.String())
	}
}

// TestAMQPSourceWritesEachMessageOnce: 3000 messages published to the exchange the source binds
// its queue to, half before the run and half during it, are each in the topic once, keyed by
// their routing keys and in their order on each, with the headers and trace context they came
// with; the source reports the queue's depth as its lag; and once the run stops, the queue holds
// nothing: every message was acknowledged.
func TestAMQPSourceWritesEachMessageOnce(t *testing.T) {
	const n = 3000
	name := amqpName(t)
	amqpQueue(t, amqpURL(), name, nil)
	ch := amqpClient(t, amqpURL())
	amqpPublish(t, ch, name, 0, n/2, false) // no message_id: at-least-once is enough without a crash
	c := server.open(t)
	plan := buildSource(t, amqpSourcePipeline("ignored", "at_least_once", amqpURL(), name))
	run := runInBackground(t, plan, runtime.Options{Redis: c})
	amqpPublish(t, ch, name, n/2, n, false)
	waitFor(t, "every message in the topic", func() bool { return stillRunning(t, run) && amqpEntries(t, c, plan.KeyPrefix) >= n })
	stopClean(t, run)
	checkEachOnce(t, amqpTopic(t, c, plan.KeyPrefix, name), n)
	if d := amqpDepth(t, amqpURL(), name); d != 0 {
		t.Errorf("the queue holds %d messages after the run: not all were acknowledged", d)
	}
	t.Logf("%d messages, each once in the topic in each routing key's order; the queue empty after", n)
}

// TestAMQPSourceReportsTheQueueDepth: a source held back (its Emitter takes one message and
// then blocks, as a full topic does) reports the messages its queue holds ready as its upstream
// lag: all but the prefetch count (500) the broker delivered to it.
func TestAMQPSourceReportsTheQueueDepth(t *testing.T) {
	const n = 3000
	name := amqpName(t)
	amqpQueue(t, amqpURL(), name, nil)
	amqpPublish(t, amqpClient(t, amqpURL()), name, 0, n, false)
	plan := buildSource(t, amqpSourcePipeline("ignored", "at_least_once", amqpURL(), name))
	kind, err := stages.SourceKindOf(plan.Sources[0])
	if err != nil {
		t.Fatal(err)
	}
	src, err := kind.New(plan.Sources[0], stages.Env{Pipeline: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	out := &heldEmitter{}
	ended := make(chan error, 1)
	go func() { ended <- src.Produce(ctx, out) }()
	waitFor(t, "the source to report the queue's depth less what it was delivered", func() bool { return out.lag.Load() == n-500 })
	stop()
	if err := <-ended; err != context.Canceled {
		t.Errorf("the source ended with %v, want context.Canceled", err)
	}
	t.Logf("the source reported a lag of %d of %d messages, holding 500 delivered", out.lag.Load(), n)
}

// heldEmitter is an Emitter that takes one message and then holds the source back, and keeps the
// lag it reports.
type heldEmitter struct {
	emitted atomic.Int64
	lag     atomic.Int64
}

func (e *heldEmitter) Emit(ctx context.Context, _ stages.Message, _ stages.Origin) error {
	if e.emitted.Add(1) > 1 {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}
func (e *heldEmitter) EmitAll(context.Context, []stages.Message, []stages.Origin) ([]string, error) {
	panic("not used")
}
func (e *heldEmitter) Reject(ctx context.Context, _ error, m stages.Message, at stages.Origin) error {
	return e.Emit(ctx, m, at)
}
func (e *heldEmitter) Resume(context.Context) (string, bool, error) { return "", false, nil }
func (e *heldEmitter) Record(context.Context, string) error         { return nil }
func (e *heldEmitter) ReportLag(n int64)                            { e.lag.Store(n) }

// TestAMQPSourceNeedsItsExchange: a source whose exchange does not exist ends the run, naming it.
func TestAMQPSourceNeedsItsExchange(t *testing.T) {
	name := amqpName(t)
	amqpClient(t, amqpURL()) // the broker is there
	plan := buildSource(t, amqpSourcePipeline("ignored", "at_least_once", amqpURL(), name))
	t.Cleanup(func() { _, _ = amqpClient(t, amqpURL()).QueueDelete(name, false, false, false) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var log syncBuffer
	_, err := runtime.Run(ctx, plan, runtime.Options{Redis: server.open(t), Logger: newLogger(&log)})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("exchange %q", name)) || strings.Contains(err.Error(), "guest:guest") {
		t.Fatalf("the run ended with %v, want the missing exchange named, without the password\n%s", err, log.String())
	}
	t.Logf("the run ended: %v", err)
}

// TestAMQPSourceWaitsOutAnOutage reads through a TCP proxy in front of the broker: once a first
// part is in the topic, the proxy resets every connection and refuses new ones while the rest is
// published (to the broker itself). Nothing arrives meanwhile; once the broker is back, every
// message is in the topic once (effectively-once with message IDs: what was delivered and not
// acknowledged before the cut is delivered again).
func TestAMQPSourceWaitsOutAnOutage(t *testing.T) {
	t.Parallel()
	const first, n = 1000, 3000
	name := amqpName(t)
	amqpQueue(t, amqpURL(), name, nil)
	ch := amqpClient(t, amqpURL())
	proxy := sqltest.NewProxy(t, amqpHost())
	c := server.open(t)
	plan := buildSource(t, amqpSourcePipeline("ignored", "effectively_once", amqpVia(proxy.Addr()), name))
	amqpPublish(t, ch, name, 0, first, true)
	run := runInBackground(t, plan, runtime.Options{Redis: c})
	waitFor(t, "the first part in the topic", func() bool { return amqpEntries(t, c, plan.KeyPrefix) == first })
	proxy.Cut()
	amqpPublish(t, ch, name, first, n, true)
	waitFor(t, "the source to try the broker while it is away", func() bool { return proxy.Refused() >= 3 })
	if got := amqpEntries(t, c, plan.KeyPrefix); got != first {
		t.Fatalf("%d entries while the broker was cut off, want %d", got, first)
	}
	proxy.Restore()
	waitFor(t, "every message in the topic", func() bool { return stillRunning(t, run) && amqpEntries(t, c, plan.KeyPrefix) >= n })
	stopClean(t, run)
	checkEachOnce(t, amqpTopic(t, c, plan.KeyPrefix, name), n)
	t.Logf("%d messages before the cut, %d connections refused while the broker was away, each of %d once at the end", first, proxy.Refused(), n)
}
