package redis

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// What a lookup stage waits for before it starts: that the stages which keep its table have
// committed what the table's topic held when it started (runtime/tables.go). It asks how far each
// stream's last entry is, and how far a consumer group has got, one pipeline per question.

// LastIDs returns the ID of the last entry of each stream, "0-0" for an empty or missing one, in
// one pipeline (on a cluster, one per node).
func (c *Client) LastIDs(ctx context.Context, streams []string) ([]string, error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*goredis.XMessageSliceCmd, len(streams))
	for i, s := range streams {
		cmds[i] = pipe.XRevRangeN(ctx, s, "+", "-", 1)
	}
	_, _ = pipe.Exec(ctx)
	out := make([]string, len(streams))
	for i, cmd := range cmds {
		last, err := cmd.Result()
		if err != nil && !isNil(err) {
			return nil, wrap(classify(err), "reading the last entry of", streams[i])
		}
		out[i] = "0-0"
		if len(last) > 0 {
			out[i] = last[0].ID
		}
	}
	return out, nil
}

// GroupProgress is how far a consumer group has got in a stream.
type GroupProgress struct {
	// Exists: the stream and the group exist.
	Exists bool
	// LastDeliveredID is the last entry delivered to the group.
	LastDeliveredID string
	// Pending counts the entries delivered and not acknowledged; LowestPending is the first of
	// them ("" when none).
	Pending       int64
	LowestPending string
}

// Committed reports whether the group has delivered and acknowledged every entry up to id: the
// commits of the stage that reads through the group include them. "0-0" is reached by any group,
// or none.
func (g GroupProgress) Committed(id string) bool {
	if id == "" || id == "0-0" {
		return true
	}
	if !g.Exists {
		return false
	}
	if c, err := CompareIDs(g.LastDeliveredID, id); err != nil || c < 0 {
		return false
	}
	if g.Pending == 0 {
		return true
	}
	c, err := CompareIDs(g.LowestPending, id)
	return err == nil && c > 0
}

// GroupsProgress returns how far group has got in each stream, in one pipeline (on a cluster, one
// per node).
func (c *Client) GroupsProgress(ctx context.Context, streams []string, group string) ([]GroupProgress, error) {
	pipe := c.rdb.Pipeline()
	infos := make([]*goredis.XInfoGroupsCmd, len(streams))
	pendings := make([]*goredis.XPendingCmd, len(streams))
	for i, s := range streams {
		infos[i] = pipe.XInfoGroups(ctx, s)
		pendings[i] = pipe.XPending(ctx, s, group)
	}
	_, _ = pipe.Exec(ctx)
	out := make([]GroupProgress, len(streams))
	for i, s := range streams {
		groups, err := infos[i].Result()
		if err != nil {
			if strings.Contains(err.Error(), "no such key") {
				continue // no stream: no group
			}
			return nil, wrap(classify(err), "reading consumer groups of", s)
		}
		for _, g := range groups {
			if g.Name != group {
				continue
			}
			id, err := parseID(g.LastDeliveredID)
			if err != nil {
				return nil, wrap(err, "reading group "+g.Name+" of", s)
			}
			out[i] = GroupProgress{Exists: true, LastDeliveredID: id.String()} // miniredis says "0" for "0-0"
		}
		if !out[i].Exists {
			continue
		}
		p, err := pendings[i].Result()
		if err != nil {
			return nil, wrap(classify(err), "reading the pending entries of group "+group+" of", s)
		}
		out[i].Pending = p.Count
		if p.Count > 0 {
			out[i].LowestPending = p.Lower
		}
	}
	return out, nil
}
