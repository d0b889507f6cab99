package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/flowrun/flowrun/runtime"
)

// The mqtt sink's proofs (see mqtt_test.go for the brokers they use): what it publishes arrives
// with its user properties, in order on each topic; a message the broker refuses is dead-lettered
// with its reason; a broker that is away pauses the sink, dead-lettering nothing.

// mqttSinkPipeline publishes topic "in" (4 partitions, keyed by msg.k) to the broker at url, on
// topic (an expression).
func mqttSinkPipeline(prefix, url, topic string) string {
	return fmt.Sprintf(`
pipeline "mqttsink" {
  key_prefix = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
sink "mq" {
  kind    = "mqtt"
  input   = topic.in
  url     = %q
  topic   = %s
  timeout = "2s"
}
`, prefix, url, topic)
}

// mqttGot is a message a test's reader received.
type mqttGot struct {
	topic string
	i     int
	k     string
	user  paho.UserProperties
}

// mqttReader collects what arrives on filter, on a persistent session that outlives the
// connection (a broker restart).
type mqttReader struct {
	mu  sync.Mutex
	got []mqttGot
}

func newMQTTReader(t *testing.T, addr, filter string) *mqttReader {
	t.Helper()
	r := &mqttReader{}
	newMQTTClient(t, addr, mqttName(t), func(p *paho.Publish) {
		var v struct {
			I int
			K string
		}
		if err := json.Unmarshal(p.Payload, &v); err != nil {
			t.Errorf("a message on %s: %v: %s", p.Topic, err, p.Payload)
		}
		g := mqttGot{topic: p.Topic, i: v.I, k: v.K}
		if p.Properties != nil {
			g.user = p.Properties.User
		}
		r.mu.Lock()
		r.got = append(r.got, g)
		r.mu.Unlock()
	}, filter)
	return r
}

func (r *mqttReader) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// check checks what arrived on <base>/out/k0..k9: its topics, user properties (origin, a
// traceparent on every 10th, a message_id), and each topic's order (of first appearance); it
// returns how many times each i arrived, and how many distinct message_ids there are.
func (r *mqttReader) check(t *testing.T, base string) (seen map[int]int, ids int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	seen, last, distinct := map[int]int{}, map[string]int{}, map[string]bool{}
	for _, g := range r.got {
		if want := base + "/out/" + g.k; g.topic != want {
			t.Fatalf("message %d on %s, want %s", g.i, g.topic, want)
		}
		if g.user.Get("origin") != "test" || g.user.Get("message_id") == "" {
			t.Fatalf("message %d has user properties %v, want origin: test and a message_id", g.i, g.user)
		}
		if tp := g.user.Get("traceparent"); g.i%10 == 0 && tp != mqttTraceparent(g.i) {
			t.Fatalf("message %d has traceparent %q, want %q", g.i, tp, mqttTraceparent(g.i))
		}
		if prev, ok := last[g.topic]; ok && seen[g.i] == 0 && g.i < prev {
			t.Fatalf("on %s, message %d after %d", g.topic, g.i, prev)
		}
		if seen[g.i] == 0 {
			last[g.topic] = g.i
		}
		seen[g.i]++
		distinct[g.user.Get("message_id")] = true
	}
	return seen, len(distinct)
}

// TestMQTTSinkDeadLettersOnlyWhatTheBrokerRefuses: of 1000 messages, every 97th is larger than
// the broker's message_size_limit (its PUBACK: 0x95, packet too large) and every 89th goes to a topic with a
// wildcard: only those are dead-lettered, each with its reason; every other message arrives,
// with its user properties, in order on its topic.
func TestMQTTSinkDeadLettersOnlyWhatTheBrokerRefuses(t *testing.T) {
	const n = 1000
	big := func(i int) bool { return i%97 == 5 }
	wild := func(i int) bool { return i%89 == 7 && !big(i) }
	broker := startMQTTBroker(t, "message_size_limit 1024")
	base := mqttName(t)
	read := newMQTTReader(t, broker.addr, base+"/out/#")
	plan := buildSource(t, mqttSinkPipeline("ignored", broker.url(), fmt.Sprintf(`msg.to == "wild" ? "%[1]s/out/+" : "%[1]s/out/${key}"`, base)))
	publishIn(t, plan, 0, n, func(i int) string {
		switch {
		case big(i):
			return `,"to":"here","pad":"` + strings.Repeat("x", 2000) + `"`
		case wild(i):
			return `,"to":"wild"`
		}
		return `,"to":"here"`
	})
	c := server.open(t)
	runServiceUntil(t, c, plan, func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "mq") == n })
	failing, bigs := 0, 0
	for i := 0; i < n; i++ {
		if big(i) || wild(i) {
			failing++
		}
		if big(i) {
			bigs++
		}
	}
	waitFor(t, "every message the broker took to arrive", func() bool { return read.count() >= n-failing })
	// Mosquitto (2.0.11) closes the connection after it refused a message too large when more
	// follow on it: the sink connects again and publishes again what had no PUBACK, which may
	// arrive twice, with the same message_id.
	seen, ids := read.check(t, base)
	twice := 0
	for i := 0; i < n; i++ {
		if (big(i) || wild(i)) && seen[i] != 0 {
			t.Errorf("message %d, refused, arrived", i)
		}
		if !big(i) && !wild(i) && seen[i] < 1 {
			t.Errorf("message %d arrived %d times", i, seen[i])
		}
		if seen[i] > 1 {
			twice++
		}
	}
	if ids != n-failing {
		t.Errorf("%d distinct message_ids, want %d", ids, n-failing)
	}
	list := sinkDeadLetters(t, c, plan, "mq")
	if len(list) != failing {
		t.Fatalf("%d dead letters, want %d", len(list), failing)
	}
	var sizes, topics int
	var examples [2]string
	for _, d := range list {
		switch p := string(d.Envelope.Payload); {
		case strings.Contains(p, `"pad"`) && strings.Contains(d.Envelope.Error, "the broker refused the message") && strings.Contains(d.Envelope.Error, "packet too large (reason code 0x95)"):
			sizes++
			examples[0] = d.Envelope.Error
		case strings.Contains(p, `"wild"`) && strings.Contains(d.Envelope.Error, "is not a topic a message can be published on"):
			topics++
			examples[1] = d.Envelope.Error
		default:
			t.Errorf("a dead letter of %.60s says %q", p, d.Envelope.Error)
		}
	}
	if sizes != bigs || topics != failing-bigs {
		t.Errorf("%d dead letters for size, %d for the topic; want %d and %d", sizes, topics, bigs, failing-bigs)
	}
	t.Logf("%d messages arrived (%d twice, by the same message_id); %d dead letters: %d %q, %d %q", n-failing, twice, len(list), sizes, examples[0], topics, examples[1])
}

// TestMQTTSinkWaitsOutABrokerRestart publishes to a private Mosquitto that is stopped once a
// first part has arrived and started again while the rest waits in the topic: the sink pauses
// (nothing arrives, nothing is dead-lettered) and once the broker is back publishes everything.
// Each of 3000 messages arrives at least once (once by its message_id), in order on its topic;
// the reader's session, kept by the broker's persistence, gets what was published before the stop.
func TestMQTTSinkWaitsOutABrokerRestart(t *testing.T) {
	const first, n = 500, 3000
	broker := startMQTTBroker(t, "")
	base := mqttName(t)
	read := newMQTTReader(t, broker.addr, base+"/out/#")
	plan := buildSource(t, mqttSinkPipeline("ignored", broker.url(), fmt.Sprintf(`"%s/out/${key}"`, base)))
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
	waitFor(t, "the first part to arrive", func() bool { return read.count() >= first })
	broker.stop()
	publishIn(t, plan, first, n, nil)
	waitFor(t, "the sink to find the broker away", func() bool {
		return strings.Count(log.String(), "connection refused") >= 3
	})
	if a := acked(t, c, plan.KeyPrefix, "in", 4, "mq"); a >= n {
		t.Fatalf("%d entries acknowledged while the broker was away", a)
	}
	if list := sinkDeadLetters(t, c, plan, "mq"); len(list) > 0 {
		t.Fatalf("%d dead letters while the broker was away, such as %q", len(list), list[0].Envelope.Error)
	}
	broker.start()
	waitFor(t, "every message published and acknowledged", func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "mq") == n })
	stopRun()
	if runErr != nil {
		t.Fatalf("%v\n%s", runErr, log.String())
	}
	waitFor(t, "every message to arrive", func() bool {
		seen, _ := read.check(t, base)
		return len(seen) >= n
	})
	seen, ids := read.check(t, base)
	twice := checkEachAtLeastOnce(t, seen, n)
	if ids != n {
		t.Errorf("%d distinct message_ids, want %d", ids, n)
	}
	if list := sinkDeadLetters(t, c, plan, "mq"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	t.Logf("%d messages before the stop; each of %d arrived (%d twice: published again after the stop), %d distinct message_ids",
		first, n, twice, ids)
}
