package runtime

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/backpressure"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Publisher writes messages into a pipeline's topics from outside a running pipeline: flowrun
// produce, tests and applications that embed flowrun. It has two ways to write:
//
//   - Publish queues one message and returns; the publisher batches the writes (pipelined XADD with
//     a linger of at most 1ms) and Flush waits until everything published before it is in Redis.
//     Each partition's messages are written in the order they were published.
//   - PublishBatch writes the messages it is given in one pipeline and returns when Redis has them:
//     for callers that batch themselves (a batch of a few hundred or thousand messages from each of
//     several goroutines is the fastest way into Redis). Concurrent calls write at once, so the
//     order between them is whatever Redis sees first.
//
// A caller that mixes the two and cares about order calls Flush before PublishBatch. When the
// caller's context holds a span, a message carries its trace context, so the pipeline's spans join
// the caller's trace.
//
// Both wait while a partition they write to is at its topic's max_lag (backpressure), until the
// topic's readers have caught up or the context ends.
type Publisher struct {
	client   *redis.Client
	plan     *flow.Plan
	streams  map[string][]string // each topic's partition streams, made once
	producer *redis.Producer
	spread   sourceSpread
	outputs  sync.Pool // of *[]redis.Output, PublishBatch's
	gates    *backpressure.Gates
	waiter   backpressure.Waiter // nil, or told when a write waits at a gate
}

// PublisherOptions configure NewPublisherWith.
type PublisherOptions struct {
	// HeldBack, when set, is called the first time a write waits for a partition of a topic that
	// is at its max_lag, so that the caller can say why it is slow. Default: nothing is said.
	HeldBack func(topic string, partition int, maxLag int64)
	// Clock is the publisher's source of time. Default: the wall clock.
	Clock stages.Clock
}

// NewPublisher returns a publisher for the plan's topics, with the default options.
func NewPublisher(c *redis.Client, plan *flow.Plan) (*Publisher, error) {
	return NewPublisherWith(c, plan, PublisherOptions{})
}

// NewPublisherWith returns a publisher for the plan's topics.
func NewPublisherWith(c *redis.Client, plan *flow.Plan, opts PublisherOptions) (*Publisher, error) {
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	if opts.Clock == nil {
		opts.Clock = stages.SystemClock{}
	}
	c = c.WithClock(redisClock{opts.Clock}).WithOffloadOver(plan.OffloadOver)
	gates := backpressure.New(c, plan, keys, opts.Clock)
	p, err := c.NewProducer(redis.ProducerOptions{Written: func(counts map[string]int, err error) {
		// What Publish let through at a capped partition is in Redis now, or never will be.
		for stream, n := range counts {
			if g := gates.Gate(stream); g != nil && err == nil {
				g.Written(int64(n))
			} else if g != nil {
				g.Dropped(int64(n))
			}
		}
	}})
	if err != nil {
		return nil, err
	}
	streams := map[string][]string{}
	for _, t := range plan.Topics {
		streams[t.Name] = keys.Streams(t.Name, t.Partitions)
	}
	pub := &Publisher{client: c, plan: plan, streams: streams, producer: p, gates: gates}
	if opts.HeldBack != nil {
		pub.waiter = &publishWaiter{told: opts.HeldBack}
	}
	return pub, nil
}

// publishWaiter tells a publisher's caller, once, that its writes wait for a full topic.
type publishWaiter struct {
	once sync.Once
	told func(topic string, partition int, maxLag int64)
}

func (w *publishWaiter) HeldBack(g *backpressure.Gate) {
	w.once.Do(func() { w.told(g.Topic(), g.Partition(), g.Limit()) })
}

func (w *publishWaiter) Released(*backpressure.Gate, time.Duration) {}

// Publish queues a message for a topic of the plan. The topic's key expression, if any, computes the
// key; otherwise m.Key is the key, and a message without one goes to the partitions in turn. An error
// about the message (it does not satisfy the topic's schema: a *flow.SchemaError; its key expression
// fails on it, its payload is not a JSON object, it is larger than the pipeline's max_message_size)
// is permanent: stages.IsPermanent reports it.
func (p *Publisher) Publish(ctx context.Context, topic string, m stages.Message) error {
	t, err := p.topic(topic)
	if err != nil {
		return err
	}
	out, err := p.output(t, &m, callerTrace(ctx))
	if err != nil {
		return err
	}
	if g := p.gates.Gate(out.Stream); g != nil {
		if err := p.gates.Admit(ctx, g, 1, p.waiter); err != nil {
			return err
		}
		// The producer reports the entry written (or dropped) once its batch is sent.
		if err := p.producer.Add(ctx, out.Stream, out.Entry); err != nil {
			g.Dropped(1)
			return err
		}
		return nil
	}
	return p.producer.Add(ctx, out.Stream, out.Entry)
}

// MessageError is PublishBatch's error about one of its messages: none was written.
type MessageError struct {
	Index int // the message's index in the batch
	Err   error
}

func (e *MessageError) Error() string { return fmt.Sprintf("message %d: %v", e.Index, e.Err) }
func (e *MessageError) Unwrap() error { return e.Err }

// PublishBatch writes messages to a topic of the plan in one pipeline, keys and partitions chosen
// as by Publish, and returns when Redis has answered. The messages of a partition are appended in
// the order of msgs. If a message cannot be written (as Publish, the error is permanent and names
// its index), none is; a failed write returns how many messages were not written.
func (p *Publisher) PublishBatch(ctx context.Context, topic string, msgs []stages.Message) error {
	t, err := p.topic(topic)
	if err != nil {
		return err
	}
	trace := callerTrace(ctx)
	buf, _ := p.outputs.Get().(*[]redis.Output)
	if buf == nil {
		buf = new([]redis.Output)
	}
	defer func() {
		clear(*buf) // the payloads are the caller's
		p.outputs.Put(buf)
	}()
	outs := (*buf)[:0]
	for i := range msgs {
		out, err := p.output(t, &msgs[i], trace)
		if err != nil {
			return &MessageError{Index: i, Err: err}
		}
		outs = append(outs, out)
	}
	*buf = outs
	if len(p.gates.Gated()) == 0 {
		return p.client.Append(ctx, outs)
	}
	counts := map[*backpressure.Gate]int64{}
	for i := range outs {
		if g := p.gates.Gate(outs[i].Stream); g != nil {
			counts[g]++
		}
	}
	admitted := make(map[*backpressure.Gate]int64, len(counts))
	for g, n := range counts {
		if err := p.gates.Admit(ctx, g, n, p.waiter); err != nil {
			for g, n := range admitted {
				g.Dropped(n)
			}
			return err
		}
		admitted[g] = n
	}
	err = p.client.Append(ctx, outs)
	for g, n := range counts {
		if err == nil {
			g.Written(n)
		} else {
			g.Dropped(n)
		}
	}
	return err
}

// topic returns a topic of the plan.
func (p *Publisher) topic(name string) (*flow.Topic, error) {
	t := p.plan.Topic(name)
	if t == nil {
		return nil, fmt.Errorf("pipeline %s has no topic %q", p.plan.Name, name)
	}
	return t, nil
}

// output routes a message of topic t to its partition and encodes it.
func (p *Publisher) output(t *flow.Topic, m *stages.Message, trace traceContext) (redis.Output, error) {
	spread := 0
	if t.Partitions > 1 {
		spread = p.spread.next("") // a counter every publishing goroutine shares: only when it matters
	}
	if err := validate(t, m); err != nil {
		return redis.Output{}, err
	}
	key, partition, err := route(t, m, spread)
	if err != nil {
		return redis.Output{}, err
	}
	e, err := entryOf(key, m, trace)
	if err != nil {
		return redis.Output{}, err
	}
	if size := redis.EntrySize(e); p.plan.MaxMessageSize > 0 && size > p.plan.MaxMessageSize {
		// Written anyway, it would be dead-lettered by every node that reads it.
		return redis.Output{}, stages.Permanent(fmt.Errorf("the message is %d bytes, larger than the pipeline's max_message_size of %s",
			size, flow.FormatSize(flow.Size(p.plan.MaxMessageSize))))
	}
	return redis.Output{Stream: p.streams[t.Name][partition], Entry: e}, nil
}

// callerTrace returns the trace context of the span in ctx, if there is one. An unsampled one is
// passed on too: the caller's sampler has decided for the whole trace.
func callerTrace(ctx context.Context) traceContext {
	var tc traceContext
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagation.TraceContext{}.Inject(ctx, carrier{&tc})
	}
	return tc
}

// Flush waits until every message Publish queued so far is written, and returns the first error
// of their writes.
func (p *Publisher) Flush(ctx context.Context) error { return p.producer.Flush(ctx) }

// Close flushes and stops the publisher.
func (p *Publisher) Close(ctx context.Context) error { return p.producer.Close(ctx) }
