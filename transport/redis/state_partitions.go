package redis

import (
	"context"
	"fmt"
	"strconv"

	goredis "github.com/redis/go-redis/v9"
)

// A stateful stage keeps its state per input partition, and a message's key picks the partition: a
// topic whose partition count changes under existing state would look for each key's state in
// another partition than the one that holds it. The runtime records, per stateful stage and input
// topic, the partition count its state was written for (Keys.StatePartitions), and at start
// compares it with the topic's, looking at the state of the recorded partitions (StateSizes). Each
// is a command on one key, so it works on a cluster as on a single server.

// RecordedPartitions returns the partition count recorded at key, and false when none is.
func (c *Client) RecordedPartitions(ctx context.Context, key string) (int, bool, error) {
	v, err := c.rdb.Get(ctx, key).Result()
	if isNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, wrap(classify(err), "reading the partition count in", key)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, false, fmt.Errorf("redis: %s holds %q, not a partition count", key, v)
	}
	return n, true, nil
}

// RecordPartitions records a partition count at key.
func (c *Client) RecordPartitions(ctx context.Context, key string, partitions int) error {
	if err := c.rdb.Set(ctx, key, strconv.Itoa(partitions), 0).Err(); err != nil {
		return wrap(classify(err), "recording the partition count in", key)
	}
	return nil
}

// runtimeFields are the fields of a state hash that the runtime keeps beside the kind's keys.
var runtimeFields = []string{WatermarkField, IdleField}

// StateSizes returns, for each partition's state hash and timer set (hashes[i] and timers[i]), the
// number of keys of the kind's state (the runtime's fields, such as the watermark, are not counted)
// and of timers, in one pipeline of commands on one key each.
func (c *Client) StateSizes(ctx context.Context, hashes, timers []string) (keys, timerCounts []int64, err error) {
	pipe := c.rdb.Pipeline()
	lens := make([]*goredis.IntCmd, len(hashes))
	marks := make([]*goredis.SliceCmd, len(hashes))
	cards := make([]*goredis.IntCmd, len(timers))
	for i := range hashes {
		lens[i] = pipe.HLen(ctx, hashes[i])
		marks[i] = pipe.HMGet(ctx, hashes[i], runtimeFields...)
		cards[i] = pipe.ZCard(ctx, timers[i])
	}
	_, _ = pipe.Exec(ctx)
	keys, timerCounts = make([]int64, len(hashes)), make([]int64, len(timers))
	for i := range hashes {
		n, err := lens[i].Result()
		if err != nil {
			return nil, nil, wrap(classify(err), "reading state", hashes[i])
		}
		own, err := marks[i].Result()
		if err != nil {
			return nil, nil, wrap(classify(err), "reading the runtime's fields in", hashes[i])
		}
		for _, v := range own {
			if v != nil {
				n--
			}
		}
		if timerCounts[i], err = cards[i].Result(); err != nil {
			return nil, nil, wrap(classify(err), "reading timers", timers[i])
		}
		keys[i] = n
	}
	return keys, timerCounts, nil
}
