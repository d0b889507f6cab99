package runtime

import (
	"context"
	"fmt"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Publisher writes messages into a pipeline's topics from outside a running pipeline: flowrun
// produce, tests and applications that embed flowrun. It batches writes (pipelined XADD with a linger
// of at most 1ms); Flush waits until everything published before it is in Redis.
type Publisher struct {
	plan     *flow.Plan
	streams  map[string][]string // each topic's partition streams, made once
	producer *redis.Producer
	spread   roundRobin
}

// NewPublisher returns a publisher for the plan's topics.
func NewPublisher(c *redis.Client, plan *flow.Plan) (*Publisher, error) {
	p, err := c.NewProducer(redis.ProducerOptions{})
	if err != nil {
		return nil, err
	}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	streams := map[string][]string{}
	for _, t := range plan.Topics {
		streams[t.Name] = keys.Streams(t.Name, t.Partitions)
	}
	return &Publisher{plan: plan, streams: streams, producer: p}, nil
}

// Publish queues a message for a topic of the plan. The topic's key expression, if any, computes the
// key; otherwise m.Key is the key, and a message without one goes to the partitions in turn. An error
// about the message (its key expression fails on it, its payload is not a JSON object) is
// permanent: stages.IsPermanent reports it.
func (p *Publisher) Publish(ctx context.Context, topic string, m stages.Message) error {
	t := p.plan.Topic(topic)
	if t == nil {
		return fmt.Errorf("pipeline %s has no topic %q", p.plan.Name, topic)
	}
	key, partition, err := route(t, &m, p.spread.next())
	if err != nil {
		return err
	}
	e, err := entryOf(key, &m, traceContext{})
	if err != nil {
		return err
	}
	return p.producer.Add(ctx, p.streams[t.Name][partition], e)
}

// Flush waits until every message published so far is written, and returns the first error of
// their writes.
func (p *Publisher) Flush(ctx context.Context) error { return p.producer.Flush(ctx) }

// Close flushes and stops the publisher.
func (p *Publisher) Close(ctx context.Context) error { return p.producer.Close(ctx) }
