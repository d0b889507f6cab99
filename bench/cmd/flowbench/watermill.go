package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"
)

// watermillHops is the peer: the same k forwarding hops built the way Watermill's documentation
// builds them, a Router with one handler per hop that subscribes to a stream (a consumer group per
// hop) and publishes what the PassthroughHandler returns to the next stream.
//
// consumers = 0 is the default set-up: one subscriber per hop, every setting at its default.
// consumers > 0 is the tuned one: watermill-redisstream has no batch setting (its subscriber reads
// with XREADGROUP COUNT 1 and acks each message with its own XACK, and its publisher sends one XADD
// per message), so the only way to more throughput its settings offer is concurrency: that many
// subscribers (consumers of the hop's group) per hop, each a handler of its own, and a connection
// pool large enough for all of their blocking reads.
func watermillHops(ctx context.Context, addr string, streams []string, consumers, pool int) error {
	if len(streams) < 2 {
		return errors.New("watermill: need at least an input and an output stream")
	}
	opts := &goredis.Options{Addr: addr}
	if pool > 0 {
		opts.PoolSize = pool
	}
	rdb := goredis.NewClient(opts)
	logger := watermill.NopLogger{}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	for i := 1; i < len(streams); i++ {
		pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, logger)
		if err != nil {
			return err
		}
		group := fmt.Sprintf("wm%d", i)
		subs := max(consumers, 1)
		for c := range subs {
			cfg := redisstream.SubscriberConfig{Client: rdb, ConsumerGroup: group}
			if consumers > 0 {
				cfg.Consumer = fmt.Sprintf("c%d", c)
			}
			sub, err := redisstream.NewSubscriber(cfg, logger)
			if err != nil {
				return err
			}
			router.AddHandler(fmt.Sprintf("hop%d-%d", i, c), streams[i-1], sub, streams[i], pub, message.PassthroughHandler)
		}
	}
	return router.Run(ctx)
}
