package redis

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// DrainStat is what the end test of a job needs to know of a stream: whether it exists, its
// length and last entry, and for each consumer group the entries it holds pending and the last one
// delivered to it. A group has entries it was not delivered yet exactly when LastID is after its
// LastDeliveredID, whatever the server's lag counters say.
type DrainStat struct {
	Exists bool
	Length int64
	LastID string // "" for an empty stream
	Groups map[string]DrainGroup
}

// DrainGroup is a consumer group's part of a DrainStat.
type DrainGroup struct {
	Pending         int64
	LastDeliveredID string
}

// DrainStats reads the DrainStat of every stream and whether each retry set holds anything, all
// in one pipeline (on a cluster, one per node): the end test of a job runs as soon as a process
// has nothing in flight, so it must cost one round trip, not several per stream.
func (c *Client) DrainStats(ctx context.Context, streams, retryKeys []string) (map[string]DrainStat, map[string]bool, error) {
	type streamCmds struct {
		xlen   *goredis.IntCmd
		last   *goredis.XMessageSliceCmd
		groups *goredis.XInfoGroupsCmd
	}
	cmds := make([]streamCmds, len(streams))
	cards := make([]*goredis.IntCmd, len(retryKeys))
	pipe := c.rdb.Pipeline()
	for i, s := range streams {
		cmds[i] = streamCmds{pipe.XLen(ctx, s), pipe.XRevRangeN(ctx, s, "+", "-", 1), pipe.XInfoGroups(ctx, s)}
	}
	for i, k := range retryKeys {
		cards[i] = pipe.ZCard(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	stats := make(map[string]DrainStat, len(streams))
	for i, s := range streams {
		groups, err := cmds[i].groups.Result()
		if err != nil {
			if strings.Contains(err.Error(), "no such key") {
				stats[s] = DrainStat{}
				continue
			}
			return nil, nil, wrap(err, "reading consumer groups of", s)
		}
		st := DrainStat{Exists: true, Groups: make(map[string]DrainGroup, len(groups))}
		if st.Length, err = cmds[i].xlen.Result(); err != nil {
			return nil, nil, wrap(err, "inspecting", s)
		}
		last, err := cmds[i].last.Result()
		if err != nil {
			return nil, nil, wrap(err, "inspecting", s)
		}
		if len(last) > 0 {
			st.LastID = last[0].ID
		}
		for _, g := range groups {
			id, err := parseID(g.LastDeliveredID)
			if err != nil {
				return nil, nil, wrap(err, "reading group "+g.Name+" of", s)
			}
			st.Groups[g.Name] = DrainGroup{Pending: g.Pending, LastDeliveredID: id.String()} // miniredis says "0" for "0-0"
		}
		stats[s] = st
	}
	waiting := make(map[string]bool, len(retryKeys))
	for i, k := range retryKeys {
		n, err := cards[i].Result()
		if err != nil {
			return nil, nil, wrap(err, "reading the retry set", k)
		}
		waiting[k] = n > 0
	}
	return stats, waiting, nil
}
