package runtime_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// rawEntries returns the fields of every entry of a stream as Redis holds them, without
// DecodeEntry (which drops what these tests check is never written).
func rawEntries(t *testing.T, c *redis.Client, stream string) []map[string]any {
	t.Helper()
	msgs, err := c.Universal().XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		out[i] = m.Values
	}
	return out
}

// xadd appends an entry with raw fields, as an application other than flowrun would.
func xadd(t *testing.T, c *redis.Client, stream string, kv ...any) {
	t.Helper()
	if err := c.Universal().XAdd(context.Background(), &goredis.XAddArgs{Stream: stream, Values: kv}).Err(); err != nil {
		t.Fatal(err)
	}
}

// garbageTraceParents are invalid W3C traceparents, some of them flagged "not sampled", which a
// fast path that only reads the flags would pass on.
var garbageTraceParents = []string{
	"garbage",
	"00-00000000000000000000000000000000-b7ad6b7169203331-00", // an all-zero trace id
	"00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-00", // uppercase
	"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", // version ff
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
}

// injectGarbage writes one message per garbage traceparent into topic in, each with a tracestate.
func injectGarbage(t *testing.T, c *redis.Client, keys redis.Keys) {
	t.Helper()
	for i, tp := range garbageTraceParents {
		xadd(t, c, keys.Stream("in", 0), "payload", `{"n":`+itoa(int64(i+1))+`}`, "traceparent", tp, "tracestate", "rojo=00f067aa0ba902b7")
	}
}

// TestInvalidTraceParentIsNotPassedOn: with tracing off, an entry's invalid traceparent, and the
// tracestate that came with it, are dropped: the message goes on without trace context.
func TestInvalidTraceParentIsNotPassedOn(t *testing.T) {
	c := server.open(t)
	plan := buildTestdata(t, "garbage.hcl")
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	injectGarbage(t, c, keys)
	j := runJob(t, c, plan, runtime.Options{})
	if n := j.node(t, "a"); n.Out != int64(len(garbageTraceParents))+1 || n.DeadLettered != 0 {
		t.Fatalf("stage a: %+v, want every message through", n)
	}
	for _, fields := range rawEntries(t, c, keys.Stream("out", 0)) {
		if fields["traceparent"] != nil || fields["tracestate"] != nil {
			t.Errorf("an output carries trace context %v %v", fields["traceparent"], fields["tracestate"])
		}
	}
}

// TestInvalidTraceParentStartsATrace: with tracing on, a message whose traceparent was invalid
// starts a new trace at the stage that read it, as one from outside without trace context does,
// and its output carries the new trace's context; nothing of the invalid one goes on.
func TestInvalidTraceParentStartsATrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c := server.open(t)
	plan := buildTestdata(t, "garbage.hcl")
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	injectGarbage(t, c, keys)
	runJob(t, c, plan, runtime.Options{TracerProvider: tp})

	roots := map[string]bool{} // trace IDs of the traces stage a started
	for _, s := range rec.Ended() {
		if s.Name() == "process in" && !s.Parent().IsValid() {
			roots[s.SpanContext().TraceID().String()] = true
		}
	}
	if len(roots) != len(garbageTraceParents) {
		t.Errorf("stage a started %d traces, want one for each of the %d messages with an invalid traceparent", len(roots), len(garbageTraceParents))
	}
	outs := rawEntries(t, c, keys.Stream("out", 0))
	if len(outs) != len(garbageTraceParents)+1 {
		t.Fatalf("%d outputs, want %d", len(outs), len(garbageTraceParents)+1)
	}
	for _, fields := range outs {
		var m map[string]any
		if err := json.Unmarshal([]byte(fields["payload"].(string)), &m); err != nil {
			t.Fatal(err)
		}
		parent, _ := fields["traceparent"].(string)
		if m["n"] == 0.0 {
			continue // the source's message, traced from the source on
		}
		if len(parent) != 55 || !strings.HasPrefix(parent, "00-") || !strings.HasSuffix(parent, "-01") || !roots[parent[3:35]] {
			t.Errorf("message %v left with traceparent %q, want one of a trace stage a started", m["n"], parent)
		}
		if fields["tracestate"] != nil {
			t.Errorf("message %v left with the tracestate %v of its invalid traceparent", m["n"], fields["tracestate"])
		}
	}
}

// deadLetterReasons runs the plan as a job and returns its stage's dead letters' errors by the
// IDs of the entries they came from.
func deadLetterReasons(t *testing.T, c *redis.Client, plan *flow.Plan, stage string) (job, map[string]string) {
	t.Helper()
	j := runJob(t, c, plan, runtime.Options{})
	dl, err := admin.OpenDeadLetters(c, plan, stage)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dl.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, d := range list {
		reasons[d.Envelope.ID] = d.Envelope.Error
	}
	return j, reasons
}

// TestHostilePayloadsAreDeadLettered: entries whose payload is not valid UTF-8, or nests too
// deeply, are dead-lettered as malformed with the reason where they are first read, even by a
// stage that passes payloads on without decoding them; good entries around them go on.
func TestHostilePayloadsAreDeadLettered(t *testing.T) {
	c := server.open(t)
	plan := buildTestdata(t, "hostile.hcl")
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	in := keys.Stream("in", 0)
	add := func(kv ...any) string {
		id, err := c.Universal().XAdd(context.Background(), &goredis.XAddArgs{Stream: in, Values: kv}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	add("payload", `{"ok":1}`)
	want := map[string]string{
		add("payload", "{\"name\":\"caf\xe9\"}"):                                            "malformed entry: payload is not valid UTF-8 (at byte 12)",
		add("type", "note", "text", "\xff\xfe"):                                             `malformed entry: field "text" is not valid UTF-8`,
		add("payload", `{"ok":2}`, "key", "k\xc0"):                                          "malformed entry: key is not valid UTF-8",
		add("payload", strings.Repeat(`[`, 5000)+`]`):                                       "malformed entry: payload is nested deeper than 1000 levels of objects and arrays (at byte 1000)",
		add("payload", `{"a":`+strings.Repeat(`{"b":`, 1000)+`1`+strings.Repeat(`}`, 1001)): "malformed entry: payload is nested deeper than 1000 levels",
	}
	add("type", "note", "text", "naïve")
	j, reasons := deadLetterReasons(t, c, plan, "pass")
	if n := j.node(t, "pass"); n.Out != 2 || n.DeadLettered != int64(len(want)) {
		t.Errorf("stage pass: %+v, want 2 passed on and %d dead-lettered", n, len(want))
	}
	for id, reason := range want {
		if !strings.HasPrefix(reasons[id], reason) {
			t.Errorf("entry %s: dead letter %q, want %q", id, reasons[id], reason)
		}
	}
	for _, fields := range rawEntries(t, c, keys.Stream("out", 0)) {
		if p := fields["payload"].(string); p != `{"ok":1}` && p != `{"text":"naïve","type":"note"}` {
			t.Errorf("output %q", p)
		}
	}
}

// TestEntryOverMaxMessageSize: an entry larger than the pipeline's max_message_size is
// dead-lettered as malformed where it is read, with its size and the limit, and without being
// decoded (its payload is not even JSON); its dead letter keeps only the start of its fields.
func TestEntryOverMaxMessageSize(t *testing.T) {
	c := server.open(t)
	plan := buildSource(t, strings.Replace(testdataSource(t, "hostile.hcl"), `pipeline "hostile" {}`,
		`pipeline "hostile" { max_message_size = "4KiB" }`, 1))
	if plan.MaxMessageSize != 4096 {
		t.Fatalf("MaxMessageSize = %d", plan.MaxMessageSize)
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	in := keys.Stream("in", 0)
	xadd(t, c, in, "payload", `{"ok":1}`)
	big := `{"blob":"` + strings.Repeat("x", 5000) // not JSON either: it is never looked at
	id, err := c.Universal().XAdd(context.Background(), &goredis.XAddArgs{Stream: in, Values: []any{"payload", big}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	xadd(t, c, in, "payload", `{"ok":2}`)
	j, reasons := deadLetterReasons(t, c, plan, "pass")
	if n := j.node(t, "pass"); n.Out != 2 || n.DeadLettered != 1 {
		t.Errorf("stage pass: %+v, want 2 passed on and 1 dead-lettered", n)
	}
	want := "malformed entry: entry is 5016 bytes (4.9 KiB), larger than the limit of 4096 bytes (4.0 KiB) (max_message_size); it was not decoded"
	if reasons[id] != want {
		t.Errorf("dead letter %q, want %q", reasons[id], want)
	}
	for _, fields := range rawEntries(t, c, keys.DeadLetter("pass")) {
		if p := fields["payload"].(string); len(p) > 2048 {
			t.Errorf("the dead letter is %d bytes, as large as the entry", len(p))
		}
	}
}

// TestPublisherRefusesMessagesOverMaxMessageSize: the publish API refuses, permanently, a message
// that every node would dead-letter, and writes nothing of its batch.
func TestPublisherRefusesMessagesOverMaxMessageSize(t *testing.T) {
	c := server.open(t)
	plan := buildSource(t, strings.Replace(testdataSource(t, "publish.hcl"), `pipeline "publish" {}`,
		`pipeline "publish" { max_message_size = "1KiB" }`, 1))
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close(context.Background()) }()
	ctx := context.Background()
	big := stages.NewMessage("", []byte(`{"k":"a","blob":"`+strings.Repeat("x", 1024)+`"}`), nil)
	small := stages.NewMessage("", []byte(`{"k":"a"}`), nil)
	err = pub.PublishBatch(ctx, "in", []stages.Message{small, big})
	if err == nil || !stages.IsPermanent(err) || !strings.Contains(err.Error(), "message 1: the message is 1054 bytes, larger than the pipeline's max_message_size of 1KiB") {
		t.Fatalf("PublishBatch = %v, want a permanent error about message 1's size", err)
	}
	if err := pub.Publish(ctx, "in", big); err == nil || !stages.IsPermanent(err) {
		t.Fatalf("Publish = %v, want a permanent error", err)
	}
	if err := pub.Publish(ctx, "in", small); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	var total int64
	for p := range 4 {
		n, err := c.StreamLen(ctx, keys.Stream("in", p))
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != 1 {
		t.Errorf("%d entries written, want only the small message", total)
	}
}
