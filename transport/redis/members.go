package redis

import (
	"context"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Heartbeat renews a process's membership in the sorted set at key (see Keys.Members) for ttl,
// forgets members whose membership expired, and returns how many members are alive, this one
// included. Processes call it on a timer to share partitions fairly.
func (c *Client) Heartbeat(ctx context.Context, key, member string, ttl time.Duration) (int, error) {
	now := time.Now()
	var card *goredis.IntCmd
	_, err := c.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.ZAdd(ctx, key, goredis.Z{Score: float64(now.Add(ttl).UnixMilli()), Member: member})
		p.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(now.UnixMilli(), 10))
		card = p.ZCard(ctx, key)
		return nil
	})
	if err != nil {
		return 0, wrap(err, "renewing membership in", key)
	}
	return int(card.Val()), nil
}

// Leave removes a process's membership, so that the others take over its share at once.
func (c *Client) Leave(ctx context.Context, key, member string) error {
	return wrap(c.rdb.ZRem(ctx, key, member).Err(), "leaving", key)
}
