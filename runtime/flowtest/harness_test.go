package flowtest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
	_ "github.com/flowrun/flowrun/stages"
)

// A ledger webhook behind a filter, with a retry policy whose backoff adds up to a minute.
const retryPipeline = `
pipeline "pay" { key_prefix = "pay" }
retry "webhook" {
  max_attempts = 5
  backoff      = "exponential"
  initial      = "4s"
  max          = "30s"
  jitter       = 0
}
topic "payments" {
  partitions = 4
  key        = msg.account
}
stage "big" {
  kind  = "filter"
  input = topic.payments
  where = msg.amount > 10
}
sink "ledger" {
  kind  = "http"
  input = stage.big
  url   = "http://127.0.0.1:1/ledger"
  retry = retry.webhook
}
`

func compile(t testing.TB, src string) *flow.Plan {
	t.Helper()
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(src)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return plan
}

func payloadOf(payload string) testfile.Message { return testfile.Message{Payload: []byte(payload)} }

func harnessOptions(t testing.TB) Options {
	if testing.Verbose() {
		return Options{Log: os.Stderr}
	}
	return Options{}
}

// retryFile sends a small and a large payment to a ledger that answers 503 four times: the
// filter drops the small one, the large one gets through on its fifth attempt.
func retryFile() *testfile.File {
	return &testfile.File{
		Path:      "p.flowtest.hcl",
		Overrides: []*testfile.SinkOverride{{Sink: "ledger", Responses: []int{503, 503, 503, 503, 200}}},
		Runs: []*testfile.Run{{
			Name: "retries",
			Steps: []*testfile.Step{{Sends: []*testfile.Send{{Topic: "payments", Messages: []testfile.Message{
				payloadOf(`{"account":"a","amount":5}`), payloadOf(`{"account":"a","amount":50}`),
			}}}}},
			Expect: []*testfile.Expect{{Sink: "ledger", HasMessages: true, Messages: []testfile.Message{payloadOf(`{"amount":50,"account":"a"}`)}}},
		}},
	}
}

func TestRetriesWaitTheirBackoffOnTheVirtualClock(t *testing.T) {
	plan := compile(t, retryPipeline)
	results := RunFile(context.Background(), retryFile(), plan, harnessOptions(t))
	if len(results) != 1 {
		t.Fatalf("%d results, want 1", len(results))
	}
	r := results[0]
	if !r.Passed() {
		t.Fatalf("the run failed: %v %+v", r.Err, r.Failures)
	}
	// Four failed attempts wait 4s, 8s, 16s and 30s before the next (no jitter): the virtual
	// clock must have passed all of it, and not much more.
	if want := 58 * time.Second; r.Virtual < want || r.Virtual > want+5*time.Second {
		t.Errorf("virtual time %s, want about %s", r.Virtual, want)
	}
}

func TestAFailedExpectationIsReported(t *testing.T) {
	plan := compile(t, retryPipeline)
	file := retryFile()
	file.Runs[0].Expect[0].Messages = []testfile.Message{payloadOf(`{"amount":51,"account":"a"}`)}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || results[0].Passed() || len(results[0].Failures) != 1 {
		t.Fatalf("want one failure, got %+v", results)
	}
	if f := results[0].Failures[0]; !strings.Contains(f.Diff, `"amount":51`) || !strings.Contains(f.Diff, `"amount":50`) {
		t.Errorf("the diff does not show the expected and the arrived message:\n%s", f.Diff)
	}
}

func TestAdvanceStopsBeforeLaterRetries(t *testing.T) {
	plan := compile(t, retryPipeline)
	file := retryFile()
	// After 10s, two attempts have failed (at 0s and 4s) and the third waits until 12s.
	file.Runs[0].Steps[0].Advance = 10 * time.Second
	file.Runs[0].Expect = []*testfile.Expect{{Sink: "ledger", HasCount: true, Count: 0}}
	file.Runs[0].Asserts = nil
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("the run failed: %+v", results)
	}
	if results[0].Virtual != 10*time.Second {
		t.Errorf("virtual time %s, want exactly the advance, 10s", results[0].Virtual)
	}
}

func TestMocksAnswerInOrder(t *testing.T) {
	plan := compileWithFuncs(t, `
pipeline "m" { key_prefix = "m" }
retry "twice" {
  max_attempts = 3
  initial      = "1s"
}
topic "in" { partitions = 1 }
stage "score" {
  kind  = "go"
  func  = "acme.score"
  input = topic.in
  retry = retry.twice
}
sink "out" {
  kind  = "stdout"
  input = stage.score
}
`, "acme.score")
	file := &testfile.File{
		Path: "m.flowtest.hcl",
		Mocks: []*testfile.Mock{{Func: "acme.score", Results: []*testfile.MockResult{
			{Error: "scoring service timeout", Times: 2}, // the first message fails twice, then passes
			{Times: 1},
			{Error: "bad input", Permanent: true}, // the second is dead-lettered at once
		}}},
		// One message per run: the calls of one message are in order, those of messages in
		// flight together are not.
		Runs: []*testfile.Run{{
			Name:   "retried until it passes",
			Steps:  []*testfile.Step{{Sends: []*testfile.Send{{Topic: "in", Messages: []testfile.Message{payloadOf(`{"n":1}`)}}}}},
			Expect: []*testfile.Expect{{Sink: "out", HasMessages: true, Messages: []testfile.Message{payloadOf(`{"n":1}`)}}},
		}, {
			Name:   "dead-lettered at once",
			Steps:  []*testfile.Step{{Sends: []*testfile.Send{{Topic: "in", Messages: []testfile.Message{payloadOf(`{"n":2}`)}}}}},
			Expect: []*testfile.Expect{{Sink: "out", HasCount: true, Count: 0}},
			ExpectDeadLetters: []*testfile.ExpectDeadLetters{{NodeType: "stage", Node: "score", HasCount: true, Count: 1,
				Messages: []testfile.DeadLetter{{Payload: []byte(`{"n":2}`), Reason: "bad input", Attempts: 1}}}},
		}},
	}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	for _, r := range results {
		if !r.Passed() {
			t.Errorf("%s failed: %v %+v", r.Run, r.Err, r.Failures)
		}
	}
}

func compileWithFuncs(t testing.TB, src string, funcs ...string) *flow.Plan {
	t.Helper()
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(src)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{GoFuncs: funcs})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return plan
}

func TestACrashLosesNothingAndTheNextProcessTakesOver(t *testing.T) {
	plan := compile(t, retryPipeline)
	file := retryFile()
	run := file.Runs[0]
	run.Steps[0].Advance = 10 * time.Second // mid-backoff
	run.Steps = append(run.Steps, &testfile.Step{Crash: true})
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("the run failed: %+v", results)
	}
	// The successor waited for the dead process's leases (a minute) before it went on.
	if results[0].Virtual < 10*time.Second+testLeaseTTL {
		t.Errorf("virtual time %s: the successor did not wait for the leases to expire", results[0].Virtual)
	}
}

// A failure's explanation points at the block of a stage that filtered the missing message, as its
// kind is conditional (stages.StageTraits.Conditional), whatever the kind is called.
func TestWhyPointsAtTheConditionThatFiltered(t *testing.T) {
	plan := compile(t, retryPipeline)
	file := retryFile()
	file.Overrides[0].Responses = []int{200}
	file.Runs[0].Expect = []*testfile.Expect{{Sink: "ledger", HasCount: true, Count: 2}}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || len(results[0].Failures) != 1 {
		t.Fatalf("want one failure, got %+v", results)
	}
	line := strings.Count(retryPipeline[:strings.Index(retryPipeline, `stage "big"`)], "\n") + 1
	want := fmt.Sprintf("stage.big filtered 1 of 2 messages (the where at p.hcl:%d)", line)
	if why := results[0].Failures[0].Why; !slices.Contains(why, want) {
		t.Errorf("the explanation is %q, want it to say %q", why, want)
	}
}

// TestAPostgresCDCSourceIsTestedWithoutADatabase: a postgres_cdc source produces only what a test
// sends it, changes as it would capture them, and never dials its database (nothing listens on
// port 1).
func TestAPostgresCDCSourceIsTestedWithoutADatabase(t *testing.T) {
	plan := compile(t, `
pipeline "shop" { key_prefix = "shop" }
source "changes" {
  kind   = "postgres_cdc"
  dsn    = "postgres://reader:secret-pw@127.0.0.1:1/shop?connect_timeout=1"
  tables = ["public.orders"]
  slot   = "flowrun_shop"
  output = topic.changes
}
topic "changes" {}
stage "inserts" {
  kind  = "filter"
  input = topic.changes
  where = msg.op == "insert"
}
sink "out" {
  kind  = "stdout"
  input = stage.inserts
}
`)
	insert := `{"op":"insert","table":"public.orders","key":{"id":1},"before":null,"after":{"id":1},"lsn":"0/16B3748","committed_at":"2026-01-01T00:00:00Z"}`
	deleted := `{"op":"delete","table":"public.orders","key":{"id":2},"before":{"id":2},"after":null,"lsn":"0/16B3790","committed_at":"2026-01-01T00:00:01Z"}`
	file := &testfile.File{
		Path: "p.flowtest.hcl",
		Runs: []*testfile.Run{{
			Name:   "changes",
			Steps:  []*testfile.Step{{Sends: []*testfile.Send{{Source: "changes", Messages: []testfile.Message{payloadOf(insert), payloadOf(deleted)}}}}},
			Expect: []*testfile.Expect{{Sink: "out", HasMessages: true, Messages: []testfile.Message{payloadOf(insert)}}},
		}},
	}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("want one passing run, got %+v", results)
	}
}

// TestASQLSinkIsTestedWithoutADatabase: flowrun test stands in for a sql sink as for any sink that
// does not write to Redis: what reaches it is captured, and the database (here, nothing listens on
// port 1) is never dialled.
func TestASQLSinkIsTestedWithoutADatabase(t *testing.T) {
	plan := compile(t, `
pipeline "shop" { key_prefix = "shop" }
topic "orders" {
  partitions = 2
  key        = msg.id
}
sink "orders_db" {
  kind     = "sql"
  input    = topic.orders
  driver   = "postgres"
  dsn      = "postgres://writer:secret-pw@127.0.0.1:1/shop?connect_timeout=1"
  table    = "orders"
  columns  = { id = msg.id, amount = msg.amount }
  where    = msg.amount > 0
  delivery = "effectively_once"
}
`)
	file := &testfile.File{
		Path: "p.flowtest.hcl",
		Runs: []*testfile.Run{{
			Name: "orders",
			Steps: []*testfile.Step{{Sends: []*testfile.Send{{Topic: "orders", Messages: []testfile.Message{
				payloadOf(`{"id":"a","amount":5}`), payloadOf(`{"id":"b","amount":0}`),
			}}}}},
			Expect: []*testfile.Expect{{Sink: "orders_db", HasMessages: true, Messages: []testfile.Message{payloadOf(`{"id":"a","amount":5}`)}}},
		}},
	}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("want one passing run, got %+v", results)
	}
}

// TestNATSKindsAreTestedWithoutAServer: flowrun test feeds a nats source and captures what
// reaches a nats sink, as for every source and sink; NATS (here, nothing listens on port 1) is
// never dialled.
func TestNATSKindsAreTestedWithoutAServer(t *testing.T) {
	plan := compile(t, `
pipeline "natsorders" { key_prefix = "natsorders" }
topic "orders" {
  partitions = 2
}
source "orders_in" {
  kind    = "nats"
  url     = "nats://app:secret-pw@127.0.0.1:1"
  stream  = "ORDERS"
  subject = "orders.>"
  durable = "flowrun_orders"
  output  = topic.orders
}
sink "big_out" {
  kind    = "nats"
  input   = topic.orders
  url     = "nats://app:secret-pw@127.0.0.1:1"
  subject = "big.${key}"
  where   = msg.amount >= 100
}
`)
	file := &testfile.File{
		Path: "p.flowtest.hcl",
		Runs: []*testfile.Run{{
			Name: "big orders",
			Steps: []*testfile.Step{{Sends: []*testfile.Send{{Source: "orders_in", Messages: []testfile.Message{
				payloadOf(`{"id":"a","amount":250}`), payloadOf(`{"id":"b","amount":5}`),
			}}}}},
			Expect: []*testfile.Expect{{Sink: "big_out", HasMessages: true, Messages: []testfile.Message{payloadOf(`{"id":"a","amount":250}`)}}},
		}},
	}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("want one passing run, got %+v", results)
	}
}

// TestAMQPKindsAreTestedWithoutABroker: flowrun test feeds an amqp source and captures what
// reaches an amqp sink, as for every source and sink; RabbitMQ (here, nothing listens on port 1)
// is never dialled.
func TestAMQPKindsAreTestedWithoutABroker(t *testing.T) {
	plan := compile(t, `
pipeline "amqporders" { key_prefix = "amqporders" }
topic "orders" {
  partitions = 2
}
source "orders_in" {
  kind        = "amqp"
  url         = "amqp://app:secret-pw@127.0.0.1:1/"
  queue       = "flowrun_orders"
  exchange    = "orders"
  binding_key = "orders.#"
  output      = topic.orders
}
sink "big_out" {
  kind        = "amqp"
  input       = topic.orders
  url         = "amqp://app:secret-pw@127.0.0.1:1/"
  exchange    = "big"
  routing_key = "big.${key}"
  where       = msg.amount >= 100
}
`)
	file := &testfile.File{
		Path: "p.flowtest.hcl",
		Runs: []*testfile.Run{{
			Name: "big orders",
			Steps: []*testfile.Step{{Sends: []*testfile.Send{{Source: "orders_in", Messages: []testfile.Message{
				payloadOf(`{"id":"a","amount":250}`), payloadOf(`{"id":"b","amount":5}`),
			}}}}},
			Expect: []*testfile.Expect{{Sink: "big_out", HasMessages: true, Messages: []testfile.Message{payloadOf(`{"id":"a","amount":250}`)}}},
		}},
	}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("want one passing run, got %+v", results)
	}
}

// TestKafkaKindsAreTestedWithoutABroker: flowrun test feeds a kafka source and captures what
// reaches a kafka sink, as for every source and sink; Kafka (here, nothing listens on port 1) is
// never dialled.
func TestKafkaKindsAreTestedWithoutABroker(t *testing.T) {
	plan := compile(t, `
pipeline "kafkaorders" { key_prefix = "kafkaorders" }
topic "orders" {
  partitions = 2
}
source "orders_in" {
  kind    = "kafka"
  brokers = ["127.0.0.1:1"]
  topics  = ["orders"]
  group   = "flowrun_orders"
  output  = topic.orders
}
sink "big_out" {
  kind    = "kafka"
  input   = topic.orders
  brokers = ["127.0.0.1:1"]
  topic   = "big"
  key     = "${msg.id}"
  where   = msg.amount >= 100
}
`)
	file := &testfile.File{
		Path: "p.flowtest.hcl",
		Runs: []*testfile.Run{{
			Name: "big orders",
			Steps: []*testfile.Step{{Sends: []*testfile.Send{{Source: "orders_in", Messages: []testfile.Message{
				payloadOf(`{"id":"a","amount":250}`), payloadOf(`{"id":"b","amount":5}`),
			}}}}},
			Expect: []*testfile.Expect{{Sink: "big_out", HasMessages: true, Messages: []testfile.Message{payloadOf(`{"id":"a","amount":250}`)}}},
		}},
	}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("want one passing run, got %+v", results)
	}
}

// TestMQTTKindsAreTestedWithoutABroker: flowrun test feeds an mqtt source and captures what
// reaches an mqtt sink, as for every source and sink; the broker (here, nothing listens on port
// 1) is never dialled.
func TestMQTTKindsAreTestedWithoutABroker(t *testing.T) {
	plan := compile(t, `
pipeline "mqttreadings" { key_prefix = "mqttreadings" }
topic "readings" {
  partitions = 2
}
source "readings_in" {
  kind      = "mqtt"
  url       = "tcp://app:secret-pw@127.0.0.1:1"
  topics    = ["sensors/+/temperature"]
  client_id = "flowrun-readings"
  output    = topic.readings
}
sink "hot_out" {
  kind  = "mqtt"
  input = topic.readings
  url   = "tcp://app:secret-pw@127.0.0.1:1"
  topic = "alerts/${msg.site}"
  where = msg.celsius >= 30
}
`)
	file := &testfile.File{
		Path: "p.flowtest.hcl",
		Runs: []*testfile.Run{{
			Name: "hot readings",
			Steps: []*testfile.Step{{Sends: []*testfile.Send{{Source: "readings_in", Messages: []testfile.Message{
				payloadOf(`{"site":"a","celsius":31}`), payloadOf(`{"site":"b","celsius":12}`),
			}}}}},
			Expect: []*testfile.Expect{{Sink: "hot_out", HasMessages: true, Messages: []testfile.Message{payloadOf(`{"site":"a","celsius":31}`)}}},
		}},
	}
	results := RunFile(context.Background(), file, plan, harnessOptions(t))
	if len(results) != 1 || !results[0].Passed() {
		t.Fatalf("want one passing run, got %+v", results)
	}
}
