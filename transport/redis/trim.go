package redis

import (
	"context"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// trimStep bounds how many entries one MAXLEN cut removes per round (the server reads them to
// find the cut position); Trim runs rounds until the stream is within MaxLen.
const trimStep = 10000

// Retention is a topic's retention policy. Zero fields mean no limit.
type Retention struct {
	// MaxLen keeps at most this many entries.
	MaxLen int64
	// MaxAge keeps entries whose ID timestamp is at most this old.
	MaxAge time.Duration
	// IgnoreGroups trims by MaxLen and MaxAge alone, even entries that a consumer group has
	// not read or not acked yet. They are lost for those groups: only when the user asks.
	IgnoreGroups bool
}

// TrimResult tells what Trim did.
type TrimResult struct {
	// Trimmed is the number of entries removed.
	Trimmed int64
	// MinID is the last XTRIM MINID argument ("" when nothing was trimmed): every entry below
	// it is gone.
	MinID string
	// Floor is the oldest ID some group still needs ("" when the stream has no group): the
	// smallest of each group's oldest pending ID and the ID after its last-delivered ID.
	Floor string
	// Clamped is true when the floor stopped the trim short of what the retention allowed.
	Clamped bool
}

// Trim applies a retention policy to a stream without ever removing an entry that some consumer
// group has not yet been delivered (ID above its last-delivered ID) or has not yet acked (ID at
// or above its oldest pending entry), unless r.IgnoreGroups.
//
// It computes a cut from MaxLen (the ID at position len-MaxLen, found by a script) and from
// MaxAge (the ID of now-MaxAge), lowers it to the groups' floor, then runs XTRIM MINID (exact).
// The floor is read after the cut: groups only move forward, so a floor read earlier is never
// above the true one. A group created during a Trim is not protected by it.
func (c *Client) Trim(ctx context.Context, stream string, r Retention, now time.Time) (TrimResult, error) {
	var res TrimResult
	if r.MaxLen <= 0 && r.MaxAge <= 0 {
		return res, nil
	}
	for {
		cut := zeroID
		more := false
		if r.MaxAge > 0 {
			cut = maxID(cut, idAt(now.Add(-r.MaxAge)))
		}
		if r.MaxLen > 0 {
			id, m, err := c.maxLenCut(ctx, stream, r.MaxLen)
			if err != nil {
				return res, err
			}
			cut, more = maxID(cut, id), m
		}
		if cut == zeroID {
			return res, nil
		}
		if !r.IgnoreGroups {
			floor, ok, err := c.groupFloor(ctx, stream)
			if err != nil {
				return res, err
			}
			if ok {
				res.Floor = floor.String()
				if floor.less(cut) {
					cut = floor
					res.Clamped = true
				}
			}
		}
		n, err := trimScript.Run(ctx, c.rdb, []string{stream, PayloadIndex(stream)}, cut.String()).Int64()
		if err != nil {
			return res, wrap(err, "trimming", stream)
		}
		res.Trimmed += n
		if n > 0 {
			res.MinID = cut.String()
		}
		if !more || res.Clamped || n == 0 {
			return res, nil
		}
	}
}

// maxLenCut returns the first ID to keep for a stream cut to maxLen entries (zeroID when the
// stream is short enough), and whether the step limit left more to cut.
func (c *Client) maxLenCut(ctx context.Context, stream string, maxLen int64) (streamID, bool, error) {
	v, err := maxLenCutScript.Run(ctx, c.rdb, []string{stream}, maxLen, trimStep).Slice()
	if isNil(err) {
		return zeroID, false, nil
	}
	if err != nil {
		return zeroID, false, wrap(err, "finding the max-length cut of", stream)
	}
	if len(v) != 2 {
		return zeroID, false, wrap(errUnexpected(v), "finding the max-length cut of", stream)
	}
	id, err := parseID(toString(v[0]))
	if err != nil {
		return zeroID, false, err
	}
	more, _ := v[1].(int64)
	return id, more == 1, nil
}

// groupFloor returns the smallest ID any group of the stream still needs; ok is false when the
// stream does not exist or has no group.
func (c *Client) groupFloor(ctx context.Context, stream string) (streamID, bool, error) {
	groups, err := c.rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return zeroID, false, nil
		}
		return zeroID, false, wrap(err, "reading consumer groups of", stream)
	}
	if len(groups) == 0 {
		return zeroID, false, nil
	}
	pipe := c.rdb.Pipeline()
	pend := make([]*goredis.XPendingCmd, len(groups))
	for i, g := range groups {
		pend[i] = pipe.XPending(ctx, stream, g.Name)
	}
	_, _ = pipe.Exec(ctx)
	var floor streamID
	for i, g := range groups {
		last, err := parseID(g.LastDeliveredID)
		if err != nil {
			return zeroID, false, wrap(err, "reading group "+g.Name+" of", stream)
		}
		f := last.next()
		p, err := pend[i].Result()
		if err != nil {
			return zeroID, false, wrap(err, "reading pending entries of group "+g.Name+" of", stream)
		}
		if p.Count > 0 {
			low, err := parseID(p.Lower)
			if err != nil {
				return zeroID, false, wrap(err, "reading pending entries of group "+g.Name+" of", stream)
			}
			f = minID(f, low)
		}
		if i == 0 {
			floor = f
		} else {
			floor = minID(floor, f)
		}
	}
	return floor, true, nil
}
