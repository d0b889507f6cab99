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

// Member is a process in the members set (Keys.Members): its ID, as given to Heartbeat, and when
// its membership expires unless it is renewed.
type Member struct {
	ID      string
	Expires time.Time
}

// Members returns the processes of the members set at key, the soonest to expire first. Lapsed
// members are included: a member whose Expires is past stopped renewing (the process died, or
// lost Redis) and is removed by the next Heartbeat of any process. The expiry times come from the
// clocks of the processes that wrote them.
func (c *Client) Members(ctx context.Context, key string) ([]Member, error) {
	zs, err := c.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		return nil, wrap(err, "reading the members in", key)
	}
	out := make([]Member, 0, len(zs))
	for _, z := range zs {
		id, _ := z.Member.(string)
		out = append(out, Member{ID: id, Expires: time.UnixMilli(int64(z.Score))})
	}
	return out, nil
}
