package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// A stateful stage keeps its state per input partition, and a message's key picks the partition: a
// topic whose partition count changes under existing state would look for each key's state in
// another partition than the one that holds it. The runtime records, per stateful stage and input
// topic, the partition count its state was written for (Keys.StatePartitions), and at start
// compares it with the topic's, looking at the state of the recorded partitions (StateHeld). Each
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

// StateHeld reports, for each partition's state hash and timer set (hashes[i] and timers[i]),
// whether it holds state: a timer, or a field of the hash other than flowrun's own, whose names
// begin with a NUL byte (the watermark, the idle mark, a kind's count of its keys), but for a
// record of keys. Each command is on one key; a hash is scanned (HSCAN) only up to its first such
// field.
func (c *Client) StateHeld(ctx context.Context, hashes, timers []string) ([]bool, error) {
	pipe := c.rdb.Pipeline()
	cards := make([]*goredis.IntCmd, len(timers))
	for i := range timers {
		cards[i] = pipe.ZCard(ctx, timers[i])
	}
	_, _ = pipe.Exec(ctx)
	held := make([]bool, len(hashes))
	for i := range hashes {
		n, err := cards[i].Result()
		if err != nil {
			return nil, wrap(classify(err), "reading timers", timers[i])
		}
		if held[i] = n > 0; held[i] {
			continue
		}
		if held[i], err = c.hasKindFields(ctx, hashes[i]); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// hasKindFields reports whether a state hash has a field that is not flowrun's own, or a record of
// keys (PackedKeysField), which holds a kind's keys.
func (c *Client) hasKindFields(ctx context.Context, hash string) (bool, error) {
	var cursor uint64
	for {
		pairs, next, err := c.rdb.HScan(ctx, hash, cursor, "", 100).Result()
		if err != nil {
			return false, wrap(classify(err), "reading state", hash)
		}
		for i := 0; i < len(pairs); i += 2 { // field, value
			if !strings.HasPrefix(pairs[i], "\x00") || strings.HasPrefix(pairs[i], PackedKeysField) {
				return true, nil
			}
		}
		if cursor = next; cursor == 0 {
			return false, nil
		}
	}
}

// A stateful stage's state means something only for the definition it was written under: an
// aggregate's accumulators for its windows and aggregate set, a dedupe's keys for its key. The
// runtime records, per stateful stage, a fingerprint of that (Keys.StateFingerprint) when the stage
// first runs, and compares it at start and on a reload.

// RecordedFingerprint returns the fingerprint and shape recorded at key; found is false when none is.
func (c *Client) RecordedFingerprint(ctx context.Context, key string) (fingerprint, shape string, found bool, err error) {
	v, err := c.rdb.HMGet(ctx, key, "fingerprint", "shape").Result()
	if err != nil {
		return "", "", false, wrap(classify(err), "reading the state fingerprint in", key)
	}
	fingerprint, _ = v[0].(string)
	shape, _ = v[1].(string)
	return fingerprint, shape, fingerprint != "", nil
}

// RecordFingerprint records a stateful stage's fingerprint and shape at key.
func (c *Client) RecordFingerprint(ctx context.Context, key, fingerprint, shape string) error {
	if err := c.rdb.HSet(ctx, key, "fingerprint", fingerprint, "shape", shape).Err(); err != nil {
		return wrap(classify(err), "recording the state fingerprint in", key)
	}
	return nil
}
