package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The kafka sink's proofs, and the round trip through SIGKILLs (see kafka_test.go for kfake).

// kafkaSinkPipeline produces topic "in" (4 partitions, keyed by msg.k) to Kafka, to topic.
func kafkaSinkPipeline(prefix, delivery, addr, topic, extra string) string {
	return fmt.Sprintf(`
pipeline "kafkasink" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
  key        = msg.k
}
sink "kout" {
  kind    = "kafka"
  input   = topic.in
  brokers = [%q]
  topic   = %s
  timeout = "2s"
  %s
}
`, prefix, delivery, addr, topic, extra)
}

// kafkaOut is a record the sink produced, as the tests read it back.
type kafkaOut struct {
	I         int
	K         string
	id        string // its flowrun-id header
	partition int32
}

// kafkaOutRecords reads topic back: each record's i, the flowrun-id that names the entry it came
// from, and checks its key (k<i%10>), its origin header and, on every 10th, the trace it continues.
func kafkaOutRecords(t *testing.T, addr, topic string) []kafkaOut {
	t.Helper()
	var out []kafkaOut
	for _, r := range kafkaRead(t, addr, topic) {
		var v kafkaOut
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("%s/%d offset %d: %v: %s", r.Topic, r.Partition, r.Offset, err, r.Value)
		}
		h := map[string]string{}
		for _, rh := range r.Headers {
			h[rh.Key] = string(rh.Value)
		}
		if want := fmt.Sprintf("k%d", v.I%10); string(r.Key) != want || h["origin"] != "test" || h["flowrun-id"] == "" {
			t.Fatalf("record %d: key %q (want %q), headers %v", v.I, r.Key, want, h)
		}
		// The trace the record was published with goes on: its trace ID is the same.
		if tp := h["traceparent"]; v.I%10 == 0 && (len(tp) != 55 || tp[3:35] != kafkaTraceparent(v.I)[3:35]) {
			t.Fatalf("record %d has traceparent %q, want one of trace %s", v.I, tp, kafkaTraceparent(v.I)[3:35])
		}
		v.id, v.partition = h["flowrun-id"], r.Partition
		out = append(out, v)
	}
	return out
}

// kafkaOnce counts each i of records, and checks that a record there twice is the same entry
// produced again (the same flowrun-id: a redelivery after a kill, which the sink produces at least
// once): it returns how many times each i is there once such repeats are dropped, and how many
// repeats there were.
func kafkaOnce(t *testing.T, records []kafkaOut) (seen map[int]int, repeats int) {
	t.Helper()
	seen, ids := map[int]int{}, map[string]int{}
	for _, r := range records {
		if prev, ok := ids[r.id]; ok {
			if prev != r.I {
				t.Fatalf("flowrun-id %s on records %d and %d", r.id, prev, r.I)
			}
			repeats++
			continue
		}
		ids[r.id] = r.I
		seen[r.I]++
	}
	return seen, repeats
}

// TestKafkaSinkDeadLettersOnlyWhatKafkaRefuses: of 1000 messages, every 97th is larger than the
// sink's max_message_bytes and every 331st goes to a topic that does not exist (kfake creates none;
// each such refusal comes after the client's own retries, seconds apart): only those are
// dead-lettered, each with Kafka's reason, and every other message is in the topic once.
func TestKafkaSinkDeadLettersOnlyWhatKafkaRefuses(t *testing.T) {
	t.Parallel()
	const n = 1000
	big := func(i int) bool { return i%97 == 5 }
	lost := func(i int) bool { return i%331 == 7 && !big(i) }
	k := startKfake(t, []string{"out:3"})
	plan := buildSource(t, kafkaSinkPipeline("ignored", "at_least_once", k.addr,
		`msg.to == "nowhere" ? "nowhere" : "out"`, `max_message_bytes = "2KiB"`))
	publishIn(t, plan, 0, n, func(i int) string {
		switch {
		case big(i):
			return `,"to":"here","pad":"` + strings.Repeat("x", 3000) + `"`
		case lost(i):
			return `,"to":"nowhere"`
		}
		return `,"to":"here"`
	})
	c := server.open(t)
	runServiceUntil(t, c, plan, func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "kout") == n })
	stored, repeats := kafkaOnce(t, kafkaOutRecords(t, k.addr, "out"))
	failing, bigs := 0, 0
	for i := 0; i < n; i++ {
		if big(i) || lost(i) {
			failing++
			if stored[i] != 0 {
				t.Errorf("message %d, refused, is in the topic", i)
			}
			delete(stored, i)
		}
		if big(i) {
			bigs++
		}
	}
	if repeats > 0 {
		t.Errorf("%d records produced twice", repeats)
	}
	checkEachOnceOf(t, stored, n-failing)
	list := sinkDeadLetters(t, c, plan, "kout")
	if len(list) != failing {
		t.Fatalf("%d dead letters, want %d", len(list), failing)
	}
	var sizes, topics int
	var examples [2]string
	for _, d := range list {
		switch p := string(d.Envelope.Payload); {
		case strings.Contains(p, `"pad"`) && strings.Contains(d.Envelope.Error, "MESSAGE_TOO_LARGE"):
			sizes++
			examples[0] = d.Envelope.Error
		case strings.Contains(p, `"nowhere"`) && strings.Contains(d.Envelope.Error, "UNKNOWN_TOPIC_OR_PARTITION"):
			topics++
			examples[1] = d.Envelope.Error
		default:
			t.Errorf("a dead letter of %.60s says %q", p, d.Envelope.Error)
		}
	}
	if sizes != bigs || topics != failing-bigs {
		t.Errorf("%d dead letters for size, %d for the topic; want %d and %d", sizes, topics, bigs, failing-bigs)
	}
	t.Logf("%d messages in the topic, each once; %d dead letters: %d %q, %d %q", n-failing, len(list), sizes, examples[0], topics, examples[1])
}

// TestKafkaSinkDoesNotProduceAgainWhatKafkaHas is what a process that died leaves behind: entries
// pending for it, the records of some of them in Kafka already (produced, and not acknowledged in
// Redis when it died), the others not. With effectively-once delivery the process that takes the
// entries over reads the topic back and produces only those whose records are not there: every
// message is in the topic once. At least once, the sink would produce them all again.
func TestKafkaSinkDoesNotProduceAgainWhatKafkaHas(t *testing.T) {
	const n = 400
	k := startKfake(t, []string{"out:3"})
	cl := kafkaClient(t, k.addr)
	plan := buildSource(t, kafkaSinkPipeline("ignored", "effectively_once", k.addr, `"out"`, ""))
	publishIn(t, plan, 0, n, nil)
	c := server.open(t)
	ctx := context.Background()
	had := 0
	for p := 0; p < 4; p++ {
		stream := redis.Keys{Prefix: plan.KeyPrefix}.Stream("in", p)
		if err := c.EnsureGroupAt(ctx, stream, "kout", "0"); err != nil {
			t.Fatal(err)
		}
		// A dead process's: 40 entries read, and the records of those not traced produced.
		b, err := c.ReadGroup(ctx, redis.ReadArgs{Stream: stream, Group: "kout", Consumer: "dead", Count: 40, Block: -1})
		if err != nil || len(b.Entries) != 40 {
			t.Fatalf("reading as the dead process: %d entries, %v", len(b.Entries), err)
		}
		for _, e := range b.Entries {
			var v kafkaOut
			if err := json.Unmarshal(e.Payload, &v); err != nil {
				t.Fatal(err)
			}
			if v.I%10 == 0 {
				continue // it died before it produced this one
			}
			r := &kgo.Record{Topic: "out", Key: []byte(v.K), Value: e.Payload, Headers: []kgo.RecordHeader{
				{Key: "origin", Value: []byte("test")}, {Key: "flowrun-id", Value: fmt.Appendf(nil, "kafkasink/kout/%d/%s", p, e.ID)}}}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
			had++
		}
	}
	b := runInBackground(t, plan, runtime.Options{Redis: c, ProcessID: "b"},
		func(rt *runtime.Runtime) { runtime.SetClaimIdle(rt, 100*time.Millisecond) })
	waitFor(t, "every entry acknowledged", func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "kout") == n })
	if err := b.stop(); err != nil {
		t.Fatalf("%v\n%s", err, b.log.String())
	}
	seen, repeats := kafkaOnce(t, kafkaOutRecords(t, k.addr, "out"))
	checkEachOnceOf(t, seen, n)
	if !b.logged("took over pending entries") {
		t.Errorf("the dead process's entries were not taken over:\n%s", b.log.String())
	}
	if repeats > 0 {
		t.Errorf("%d of the %d records Kafka had were produced again", repeats, had)
	}
	if list := sinkDeadLetters(t, c, plan, "kout"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	t.Logf("%d messages each once in the topic; %d of them were there before the run", n, had)
}

// checkEachOnceOf checks that each i of seen is there once, and that there are n of them.
func checkEachOnceOf(t *testing.T, seen map[int]int, n int) {
	t.Helper()
	for i, k := range seen {
		if k != 1 {
			t.Errorf("message %d is there %d times", i, k)
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages, want %d", len(seen), n)
	}
}

// TestKafkaSinkWaitsOutAnOutage: once a first part is in the topic, kfake is stopped while the
// rest is published to the pipeline; the sink pauses, dead-lettering nothing, and once kfake is
// started again (on its state) produces everything: each message in the topic once.
func TestKafkaSinkWaitsOutAnOutage(t *testing.T) {
	t.Parallel()
	const first, n = 500, 3000
	k := startKfake(t, []string{"out:3"})
	plan := buildSource(t, kafkaSinkPipeline("ignored", "at_least_once", k.addr, `"out"`, ""))
	publishIn(t, plan, 0, first, nil)
	c := server.open(t)
	run := runInBackground(t, plan, runtime.Options{Redis: c})
	waitFor(t, "the first part acknowledged", func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "kout") == first })
	k.stop()
	publishIn(t, plan, first, n, nil)
	time.Sleep(3 * time.Second) // longer than the sink's timeout (2s): it tries Kafka while it is away
	if got := acked(t, c, plan.KeyPrefix, "in", 4, "kout"); got != first {
		t.Fatalf("%d entries acknowledged while Kafka was away", got-first)
	}
	if list := sinkDeadLetters(t, c, plan, "kout"); len(list) > 0 {
		t.Fatalf("%d dead letters while Kafka was away, such as %q", len(list), list[0].Envelope.Error)
	}
	k.start()
	waitFor(t, "every message produced and acknowledged", func() bool { return acked(t, c, plan.KeyPrefix, "in", 4, "kout") == n })
	if err := run.stop(); err != nil {
		t.Fatalf("%v\n%s", err, run.log.String())
	}
	seen, repeats := kafkaOnce(t, kafkaOutRecords(t, k.addr, "out"))
	checkEachOnceOf(t, seen, n)
	if repeats > 0 {
		t.Errorf("%d records produced twice", repeats)
	}
	if list := sinkDeadLetters(t, c, plan, "kout"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	t.Logf("%d messages before kfake stopped, each of %d once at the end, none dead-lettered", first, n)
}

// kafkaRoundTripScale is how many records the round trip sends.
func kafkaRoundTripScale() int {
	if *soakFlag {
		return 100000
	}
	return 4000
}

// TestKafkaRoundTripThroughKills is the kafka kinds' proof: records produced on ten keys to a
// topic of 4 partitions go through the source (effectively-once), two stages and the sink to
// another topic, while two flowrun processes are SIGKILLed mid-stream and kfake is restarted once
// (stopped and started again on its state) between them; a last process runs until the sink has
// acknowledged everything. Every record is out, each key's records in their order, with the trace
// it came in with, exactly once: the pipeline is effectively-once, and the sink reads back what a
// killed process produced and had not acknowledged rather than producing it again.
func TestKafkaRoundTripThroughKills(t *testing.T) {
	t.Parallel()
	n := kafkaRoundTripScale()
	k := startKfake(t, []string{"orders:4", "shipped:4"})
	cl := kafkaClient(t, k.addr)
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("kafkaround-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "kafka.hcl")
	src := fmt.Sprintf(`
pipeline "kafkaroundtrip" {
  key_prefix = %[1]q
  delivery   = "effectively_once"
}
topic "in" {
  partitions = 4
}
source "orders" {
  kind    = "kafka"
  brokers = [%[2]q]
  topics  = ["orders"]
  group   = "flowrun"
  output  = topic.in
}
stage "mark" {
  kind  = "map"
  input = topic.in
  set   = { k = "k${msg.i %% 10}", via = "flowrun" }
}
stage "ship" {
  kind  = "filter"
  input = stage.mark
  where = msg.i >= 0
}
sink "shipped" {
  kind    = "kafka"
  input   = stage.ship
  brokers = [%[2]q]
  topic   = "shipped"
}
`, prefix, k.addr)
	writeFile(t, path, src)
	plan := buildSource(t, src)
	plan.KeyPrefix = prefix // buildSource gives a plan a prefix of its own: the processes use the file's
	kafkaProduce(t, cl, "orders", 0, n/2)
	bin := flowrunBinary(t)
	// Leases of a second: on a shared machine a stalled process must not lose its partitions over
	// and over (until its entries count as poison), which is not what the kills test.
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "1s"}
	outCount := func() int64 { return acked(t, c, prefix, "ship.out", 4, "shipped") }
	var logs []string
	for cycle := 0; cycle < 2; cycle++ {
		before := outCount()
		p := startBinary(t, bin, args...)
		// Mid-stream: no more than half of what is still to come out.
		progress := min(int64(300+rand.IntN(n/4)), (int64(n)-before)/2)
		waitFor(t, fmt.Sprintf("cycle %d: %d records more out", cycle, progress), func() bool { return outCount()-before >= progress })
		if cycle == 0 {
			// kfake restarted mid-stream, under the running process, and the rest produced.
			k.restart()
			kafkaProduce(t, cl, "orders", n/2, n)
			before = outCount()
			waitFor(t, "records out after kfake's restart", func() bool { return outCount()-before >= 100 })
		}
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	last := startBinary(t, bin, args...)
	waitProgress(t, "every record out", int64(n), outCount)
	waitFor(t, "the group to have committed every offset", func() bool { return kafkaCommitted(t, k.addr, "flowrun", "orders") == int64(n) })
	last.kill(t)
	logs = append(logs, last.log.String())
	records := kafkaOutRecords(t, k.addr, "shipped")
	seen, repeats := kafkaOnce(t, records)
	checkEachOnceOf(t, seen, n)
	if repeats > 0 {
		t.Errorf("%d records produced twice (the same flowrun-id)", repeats)
	}
	// Each key's records in their order, in the partition its key gives.
	last2, ids := map[string]int{}, map[string]bool{}
	parts := map[string]int32{}
	for _, r := range records {
		if ids[r.id] {
			continue
		}
		ids[r.id] = true
		if p, ok := parts[r.K]; ok && p != r.partition {
			t.Fatalf("key %s in partitions %d and %d", r.K, p, r.partition)
		}
		parts[r.K] = r.partition
		if prev, ok := last2[r.K]; ok && r.I < prev {
			t.Fatalf("key %s: record %d after %d", r.K, r.I, prev)
		}
		last2[r.K] = r.I
	}
	if list := sinkDeadLetters(t, c, plan, "shipped"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	t.Logf("%d records through source, two stages and sink, 2 SIGKILLs and kfake restarted: each out once, each key in order in one partition; %d leases lost; %d entries the sink found in Kafka already",
		n, leaseLosses(logs...), strings.Count(strings.Join(logs, ""), "kafka: found in Kafka already"))
}

// TestKafkaSinkThroughKills produces a topic's messages to Kafka with flowrun processes that are
// SIGKILLed after random progress, the runtime delivering again what a killed process had not
// acknowledged; a last process runs until every entry is acknowledged. With effectively-once
// delivery each message is in the topic exactly once; at least once, each is there at least once,
// and a message there twice is the same entry produced again (the same flowrun-id).
func TestKafkaSinkThroughKills(t *testing.T) {
	t.Parallel()
	for _, delivery := range []string{"effectively_once", "at_least_once"} {
		t.Run(delivery, func(t *testing.T) { kafkaSinkThroughKills(t, delivery) })
	}
}

func kafkaSinkThroughKills(t *testing.T, delivery string) {
	kills, n := kafkaKillCycles()
	k := startKfake(t, []string{"out:4"})
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("kafkasinkkill-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "kafka.hcl")
	src := kafkaSinkPipeline(prefix, delivery, k.addr, `"out"`, "")
	writeFile(t, path, src)
	plan := buildSource(t, src)
	plan.KeyPrefix = prefix // buildSource gives a plan a prefix of its own: the processes use the file's
	publishIn(t, plan, 0, n, nil)
	bin := flowrunBinary(t)
	// Leases of a second: on a shared machine a stalled process must not lose its partitions over
	// and over (until its entries count as poison), which is not what the kills test.
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "1s"}
	done := func() int64 { return acked(t, c, prefix, "in", 4, "kout") }
	var logs []string
	for cycle := 0; cycle < kills; cycle++ {
		before := done()
		p := startBinary(t, bin, args...)
		progress := int64(300 + rand.IntN(2000))
		waitFor(t, fmt.Sprintf("cycle %d: %d entries more acknowledged", cycle, progress), func() bool {
			// No entry in flight has been delivered more than twice: an effectively-once sink reads
			// the topic back before it produces a redelivered batch, and kills faster than that
			// would make the batch a poison message (mostDelivered).
			return (done()-before >= progress || done() >= int64(n)) &&
				mostDelivered(t, c, "kout", redis.Keys{Prefix: prefix}.Streams("in", 4)...) <= 2
		})
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	last := startBinary(t, bin, args...)
	waitFor(t, "every entry acknowledged", func() bool { return done() == int64(n) })
	last.kill(t)
	logs = append(logs, last.log.String())
	seen, repeats := kafkaOnce(t, kafkaOutRecords(t, k.addr, "out"))
	checkEachOnceOf(t, seen, n)
	if delivery == "effectively_once" && repeats > 0 {
		t.Errorf("%d records produced twice (the same flowrun-id)", repeats)
	}
	if list := sinkDeadLetters(t, c, plan, "kout"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	t.Logf("%s: %d messages produced through %d SIGKILLs: each in the topic, %d produced again after a kill (same flowrun-id), %d times the sink found records in Kafka already; %d leases lost",
		delivery, n, kills, repeats, strings.Count(strings.Join(logs, ""), "kafka: found in Kafka already"), leaseLosses(logs...))
}

// TestKafkaTraceCrossesKafka: records produced with a traceparent go through the source, a stage
// and the sink with tracing on; each comes out with a traceparent of the same trace whose span is
// one of the pipeline's, descended from the span the record came in with.
func TestKafkaTraceCrossesKafka(t *testing.T) {
	const n = 200
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	k := startKfake(t, []string{"orders:2", "shipped:2"})
	kafkaProduce(t, kafkaClient(t, k.addr), "orders", 0, n)
	plan := buildSource(t, fmt.Sprintf(`
pipeline "kafkatrace" {}
topic "in" {
  partitions = 2
}
source "orders" {
  kind    = "kafka"
  brokers = [%[1]q]
  topics  = ["orders"]
  group   = "flowrun"
  output  = topic.in
}
stage "mark" {
  kind  = "map"
  input = topic.in
  set   = { k = "k${msg.i %% 10}" }
}
sink "shipped" {
  kind    = "kafka"
  input   = stage.mark
  brokers = [%[1]q]
  topic   = "shipped"
}
`, k.addr))
	c := server.open(t)
	run := runInBackground(t, plan, runtime.Options{Redis: c, TracerProvider: tp})
	waitFor(t, "every record out", func() bool { return acked(t, c, plan.KeyPrefix, "mark.out", 2, "shipped") == n })
	if err := run.stop(); err != nil {
		t.Fatalf("%v\n%s", err, run.log.String())
	}
	parents := map[string]string{} // span ID: its parent's
	for _, s := range rec.Ended() {
		parents[s.SpanContext().SpanID().String()] = s.Parent().SpanID().String()
	}
	traced := 0
	for _, r := range kafkaRead(t, k.addr, "shipped") {
		var v struct{ I int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatal(err)
		}
		if v.I%10 != 0 {
			continue
		}
		var out string
		for _, h := range r.Headers {
			if h.Key == "traceparent" {
				out = string(h.Value)
			}
		}
		in := kafkaTraceparent(v.I)
		if len(out) != 55 || out[3:35] != in[3:35] || out[36:52] == in[36:52] {
			t.Fatalf("record %d came in with %s and out with traceparent %q: want another span of its trace", v.I, in, out)
		}
		// Up from the span it went out with, through the pipeline's spans, to the one it came in with.
		span, hops := out[36:52], 0
		for ; span != in[36:52]; hops++ {
			parent, ok := parents[span]
			if !ok || hops > 10 {
				t.Fatalf("record %d: span %s of its way out is not a descendant of %s, the span it came in with", v.I, out[36:52], in[36:52])
			}
			span = parent
		}
		traced++
	}
	if traced != n/10 {
		t.Errorf("%d traced records out, want %d", traced, n/10)
	}
	t.Logf("%d records came in with a traceparent and went out with a span of the same trace, descended from theirs (%d spans recorded)", traced, len(rec.Ended()))
}
