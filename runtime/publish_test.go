package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestPublishBatch writes keyed messages in one call: each lands in its key's partition, in the
// order of the batch, with the trace context of the caller's span.
func TestPublishBatch(t *testing.T) {
	c := server.open(t)
	plan := buildTestdata(t, "publish.hcl")
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close(context.Background()) }()
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()

	var msgs []stages.Message
	for i := range 100 {
		msgs = append(msgs, stages.NewMessage("", fmt.Appendf(nil, `{"k":"k%d","n":%d}`, i%7, i), nil))
	}
	if err := pub.PublishBatch(ctx, "in", msgs); err != nil {
		t.Fatal(err)
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	last := map[string]float64{}
	total := 0
	for p := range 4 {
		recs, err := c.Read(context.Background(), keys.Stream("in", p), "0", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			total++
			m := jsonObject(t, string(r.Payload))
			k, n := m["k"].(string), m["n"].(float64)
			if r.Key != k || redis.Partition(k, 4) != p {
				t.Errorf("message %v (key %q) is in partition %d with key %q", n, k, p, r.Key)
			}
			if prev, ok := last[k]; ok && prev >= n {
				t.Errorf("key %s: message %v after %v", k, n, prev)
			}
			last[k] = n
			if want := span.SpanContext().TraceID().String(); !strings.Contains(r.TraceParent, want) {
				t.Errorf("message %v carries traceparent %q, want the caller's trace %s", n, r.TraceParent, want)
			}
		}
	}
	if total != 100 {
		t.Errorf("%d messages written, want 100", total)
	}
}

// TestPublishBatchWritesNothingOnABadMessage: a message the topic's key expression fails on makes
// the whole batch fail, permanently, naming the message, before anything is written.
func TestPublishBatchWritesNothingOnABadMessage(t *testing.T) {
	c := server.open(t)
	plan := buildTestdata(t, "publish.hcl")
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close(context.Background()) }()
	ctx := context.Background()
	msgs := []stages.Message{
		stages.NewMessage("", []byte(`{"k":"a"}`), nil),
		stages.NewMessage("", []byte(`{"no_k":1}`), nil),
	}
	err = pub.PublishBatch(ctx, "in", msgs)
	if err == nil || !stages.IsPermanent(err) || !strings.Contains(err.Error(), "message 1") {
		t.Fatalf("PublishBatch = %v, want a permanent error about message 1", err)
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	for p := range 4 {
		if n, err := c.StreamLen(ctx, keys.Stream("in", p)); err != nil || n != 0 {
			t.Errorf("partition %d holds %d entries (%v), want none", p, n, err)
		}
	}
	if err := pub.PublishBatch(ctx, "nope", msgs); err == nil || !strings.Contains(err.Error(), `no topic "nope"`) {
		t.Errorf("PublishBatch to an unknown topic = %v", err)
	}
}
