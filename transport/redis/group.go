package redis

import (
	"context"
	"strings"
)

// EnsureGroup creates the consumer group at ID 0 (so that it sees every entry already in the
// stream), creating the stream too if needed (XGROUP CREATE ... 0 MKSTREAM). An existing group
// is left as it is (BUSYGROUP is success).
func (c *Client) EnsureGroup(ctx context.Context, stream, group string) error {
	return c.EnsureGroupAt(ctx, stream, group, "0")
}

// EnsureGroupAt is EnsureGroup with the ID a new group starts after: "0" for every entry, "$" for
// only those added from now on.
func (c *Client) EnsureGroupAt(ctx context.Context, stream, group, start string) error {
	err := c.rdb.XGroupCreateMkStream(ctx, stream, group, start).Err()
	if err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return nil
	}
	return wrap(err, "creating consumer group "+group+" on", stream)
}

// DeleteIdleConsumer deletes a consumer from a group only if it has no pending entries, checked
// and done in one script (a plain XGROUP DELCONSUMER drops the consumer's pending entries from
// the group, and they are never delivered again). It reports whether the consumer is gone
// (true also when it did not exist); false means it still has pending entries, which should be
// reclaimed first.
func (c *Client) DeleteIdleConsumer(ctx context.Context, stream, group, consumer string) (bool, error) {
	n, err := deleteIdleConsumerScript.Run(ctx, c.rdb, []string{stream}, group, consumer).Int()
	if err != nil {
		return false, wrap(classify(err), "deleting consumer "+consumer+" of group "+group+" on", stream)
	}
	return n == 1, nil
}
