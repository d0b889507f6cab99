package redis

import (
	"context"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Membership is what a heartbeat (Heartbeat) found in the members sets.
type Membership struct {
	// Live is how many members each set has alive, the one that beat included, in the order of the
	// keys.
	Live []int
	// NextLapse is the soonest time at which another member's membership lapses unless it is
	// renewed, in any of the sets; zero when the sets have no other member. A live member renews
	// its membership several times per TTL, so a lapse that comes sooner than that is most likely
	// a dead member's: the survivors look again right then, to take its share over.
	NextLapse time.Time
}

// Heartbeat renews a process's membership in the sorted sets at keys (see Keys.Members and
// Keys.NodeMembers) for ttl, forgets members whose membership expired, and returns how many members
// each set has alive and when the next other member lapses. Processes call it on a timer to share
// partitions fairly. All of it is one pipeline (the sets may live on different nodes of a cluster),
// each set's commands in order.
func (c *Client) Heartbeat(ctx context.Context, keys []string, member string, ttl time.Duration) (Membership, error) {
	now := c.now()
	cards := make([]*goredis.IntCmd, len(keys))
	soonest := make([]*goredis.ZSliceCmd, len(keys))
	_, err := c.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, key := range keys {
			p.ZAdd(ctx, key, goredis.Z{Score: float64(now.Add(ttl).UnixMilli()), Member: member})
			p.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(now.UnixMilli(), 10))
			cards[i] = p.ZCard(ctx, key)
			// The two soonest to lapse: at least one of them is another member's, if there is one.
			soonest[i] = p.ZRangeWithScores(ctx, key, 0, 1)
		}
		return nil
	})
	if err != nil {
		return Membership{}, wrap(err, "renewing membership in", keys[0])
	}
	m := Membership{Live: make([]int, len(keys))}
	for i, card := range cards {
		m.Live[i] = int(card.Val())
		for _, z := range soonest[i].Val() {
			if id, _ := z.Member.(string); id != member {
				lapse := time.UnixMilli(int64(z.Score))
				if m.NextLapse.IsZero() || lapse.Before(m.NextLapse) {
					m.NextLapse = lapse
				}
				break
			}
		}
	}
	return m, nil
}

// Leave removes a process's membership from the sets at keys, so that the others take over its
// share at once.
func (c *Client) Leave(ctx context.Context, keys []string, member string) error {
	pipe := c.rdb.Pipeline()
	for _, key := range keys {
		pipe.ZRem(ctx, key, member)
	}
	_, err := pipe.Exec(ctx)
	return wrap(err, "leaving", keys[0])
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
