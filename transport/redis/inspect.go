package redis

import (
	"context"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// maxLagScan bounds the entries StreamStats counts when it has to compute a lag itself.
const maxLagScan = 100000

// StreamInfo describes a stream and its consumer groups.
type StreamInfo struct {
	Stream string
	// Exists is false when there is no such key; the other fields are then zero.
	Exists bool
	// Length is the number of entries (XLEN).
	Length int64
	// FirstID and LastID are the IDs of the first and last entries ("" when empty).
	FirstID string
	LastID  string
	// Groups are the consumer groups, in the order Redis reports them.
	Groups []GroupInfo
}

// GroupInfo describes one consumer group of a stream.
type GroupInfo struct {
	Name      string
	Consumers int64
	// Pending is the number of entries delivered and not yet acked.
	Pending int64
	// Lag is the number of entries not yet delivered to the group.
	Lag int64
	// LagExact is false when Lag is a lower bound: the server could not tell the lag and
	// counting stopped after 100,000 entries.
	LagExact bool
	// LastDeliveredID is the ID of the last entry delivered to the group.
	LastDeliveredID string
	// OldestPendingID is the smallest pending ID ("" when nothing is pending), and
	// OldestPendingIdle the time since it was last delivered.
	OldestPendingID   string
	OldestPendingIdle time.Duration
	// OldestPendingDeliveries is how many times the oldest pending entry was delivered.
	OldestPendingDeliveries int64
}

// StreamStats returns a stream's length, first and last IDs and, per group, consumers, pending
// count, lag, last-delivered ID and the oldest pending entry with its idle time.
//
// The lag comes from XINFO GROUPS (Redis 7). When the server cannot tell it (nil lag, or an
// entries-read counter that is not maintained, as in miniredis, which reports the stream length
// as lag), it is computed from the last-delivered ID: 0 when that is at or past the last entry,
// the length when it is before the first, and otherwise by counting (bounded, see LagExact).
func (c *Client) StreamStats(ctx context.Context, stream string) (StreamInfo, error) {
	info := StreamInfo{Stream: stream}
	pipe := c.rdb.Pipeline()
	typ := pipe.Type(ctx, stream)
	xlen := pipe.XLen(ctx, stream)
	first := pipe.XRangeN(ctx, stream, "-", "+", 1)
	last := pipe.XRevRangeN(ctx, stream, "+", "-", 1)
	groupsCmd := pipe.XInfoGroups(ctx, stream)
	_, _ = pipe.Exec(ctx)
	t, err := typ.Result()
	if err != nil {
		return info, wrap(err, "inspecting", stream)
	}
	if t == "none" {
		return info, nil
	}
	info.Exists = true
	if info.Length, err = xlen.Result(); err != nil {
		return info, wrap(err, "inspecting", stream)
	}
	if msgs, err := first.Result(); err != nil {
		return info, wrap(err, "inspecting", stream)
	} else if len(msgs) > 0 {
		info.FirstID = msgs[0].ID
	}
	if msgs, err := last.Result(); err != nil {
		return info, wrap(err, "inspecting", stream)
	} else if len(msgs) > 0 {
		info.LastID = msgs[0].ID
	}
	groups, err := groupsCmd.Result()
	if err != nil {
		return info, wrap(err, "reading consumer groups of", stream)
	}
	if len(groups) == 0 {
		return info, nil
	}
	pipe = c.rdb.Pipeline()
	oldest := make([]*goredis.XPendingExtCmd, len(groups))
	for i, g := range groups {
		oldest[i] = pipe.XPendingExt(ctx, &goredis.XPendingExtArgs{
			Stream: stream, Group: g.Name, Start: "-", End: "+", Count: 1,
		})
	}
	_, _ = pipe.Exec(ctx)
	for i, g := range groups {
		last, err := parseID(g.LastDeliveredID)
		if err != nil {
			return info, wrap(err, "reading group "+g.Name+" of", stream)
		}
		gi := GroupInfo{
			Name:            g.Name,
			Consumers:       g.Consumers,
			Pending:         g.Pending,
			LastDeliveredID: last.String(), // miniredis says "0" for "0-0"
			Lag:             g.Lag,
			LagExact:        true,
		}
		p, err := oldest[i].Result()
		if err != nil {
			return info, wrap(err, "reading pending entries of group "+g.Name+" of", stream)
		}
		if len(p) > 0 {
			gi.OldestPendingID = p[0].ID
			gi.OldestPendingIdle = p[0].Idle
			gi.OldestPendingDeliveries = p[0].RetryCount
		}
		// go-redis reports a nil lag as -1 and a nil entries-read as 0. A group that has been
		// delivered entries but claims to have read none has no usable counters.
		if g.Lag < 0 || (g.EntriesRead == 0 && last != zeroID) {
			gi.Lag, gi.LagExact, err = c.countLag(ctx, info, gi.LastDeliveredID)
			if err != nil {
				return info, err
			}
		}
		info.Groups = append(info.Groups, gi)
	}
	return info, nil
}

// countLag counts the entries after lastDelivered.
func (c *Client) countLag(ctx context.Context, info StreamInfo, lastDelivered string) (int64, bool, error) {
	if info.Length == 0 {
		return 0, true, nil
	}
	ld, err := parseID(lastDelivered)
	if err != nil {
		return 0, false, err
	}
	lastID, err := parseID(info.LastID)
	if err != nil {
		return 0, false, err
	}
	firstID, err := parseID(info.FirstID)
	if err != nil {
		return 0, false, err
	}
	if !ld.less(lastID) {
		return 0, true, nil
	}
	if ld.less(firstID) {
		return info.Length, true, nil
	}
	var n int64
	start := ld.next().String()
	for n < maxLagScan {
		msgs, err := c.rdb.XRangeN(ctx, info.Stream, start, "+", 1000).Result()
		if err != nil {
			return 0, false, wrap(err, "counting the lag of", info.Stream)
		}
		n += int64(len(msgs))
		if len(msgs) < 1000 {
			return n, true, nil
		}
		id, err := parseID(msgs[len(msgs)-1].ID)
		if err != nil {
			return 0, false, err
		}
		start = id.next().String()
	}
	return n, false, nil
}

// ScheduledRetries returns how many messages wait in a retry set (Keys.Retry) for their next
// attempt: its size (ZCARD), 0 when it does not exist.
func (c *Client) ScheduledRetries(ctx context.Context, key string) (int64, error) {
	n, err := c.rdb.ZCard(ctx, key).Result()
	if err != nil {
		return 0, wrap(err, "counting the retries in", key)
	}
	return n, nil
}

// ReaderKeys names a reader of a stream for PollReaders: its consumer group, and its retry set
// (Keys.Retry; "" for a reader that has none, such as a redis_stream source).
type ReaderKeys struct {
	Group    string
	RetryKey string
}

// ReaderState is one reader's state on a stream, as PollReaders reads it.
type ReaderState struct {
	// Group is the reader's consumer group as StreamStats reports it. Exists is false when the
	// group has not been created yet; Group then holds only its Name.
	Group  GroupInfo
	Exists bool
	// Lag is the entries not yet delivered to the group: the group's lag, or the stream's whole
	// length when the group does not exist yet. Pending is the entries delivered and not acked.
	Lag     int64
	Pending int64
	// Retries is the number of entries waiting in the reader's retry set.
	Retries int64
}

// PollReaders reads a stream (StreamStats) and, for each reader, its group's lag and pending
// entries and the size of its retry set, in the order of readers. It is the one poll of a
// partition's lag, pending entries and retries: a running pipeline's and flowrun inspect's. A
// stream that does not exist yet reads as empty. On an error the results read so far are returned
// with it.
func (c *Client) PollReaders(ctx context.Context, stream string, readers ...ReaderKeys) (StreamInfo, []ReaderState, error) {
	info, err := c.StreamStats(ctx, stream)
	if err != nil {
		return info, nil, err
	}
	states := make([]ReaderState, 0, len(readers))
	for _, r := range readers {
		st := ReaderState{Group: GroupInfo{Name: r.Group}, Lag: info.Length}
		for _, g := range info.Groups {
			if g.Name == r.Group {
				st.Group, st.Exists, st.Lag, st.Pending = g, true, g.Lag, g.Pending
			}
		}
		if r.RetryKey != "" {
			n, err := c.ScheduledRetries(ctx, r.RetryKey)
			if err != nil {
				return info, states, err
			}
			st.Retries = n
		}
		states = append(states, st)
	}
	return info, states, nil
}

// Backlog returns how many entries of a stream the slowest of the given consumer groups has not
// yet processed: not delivered to it (lag) or delivered and not acknowledged (pending). A group
// that does not exist yet counts every entry: it will start from the beginning. It is 0 for a
// stream that does not exist.
func (c *Client) Backlog(ctx context.Context, stream string, groups []string) (int64, error) {
	pipe := c.rdb.Pipeline()
	xlen := pipe.XLen(ctx, stream)
	infos := pipe.XInfoGroups(ctx, stream)
	_, _ = pipe.Exec(ctx)
	length, err := xlen.Result()
	if err != nil {
		return 0, wrap(err, "measuring the backlog of", stream)
	}
	if length == 0 {
		return 0, nil
	}
	found, err := infos.Result()
	if err != nil && !strings.HasPrefix(err.Error(), "ERR no such key") {
		return 0, wrap(err, "measuring the backlog of", stream)
	}
	var worst int64
	for _, name := range groups {
		backlog := length
		for _, g := range found {
			if g.Name != name {
				continue
			}
			if g.Lag < 0 || (g.EntriesRead == 0 && g.LastDeliveredID != "0-0" && g.LastDeliveredID != "0") {
				// The server cannot tell the lag (see StreamStats): measure it the slow way.
				return c.slowBacklog(ctx, stream, groups)
			}
			backlog = g.Lag + g.Pending
		}
		worst = max(worst, backlog)
	}
	return worst, nil
}

// slowBacklog is Backlog from StreamStats, for servers whose groups do not report their lag.
func (c *Client) slowBacklog(ctx context.Context, stream string, groups []string) (int64, error) {
	info, err := c.StreamStats(ctx, stream)
	if err != nil {
		return 0, err
	}
	var worst int64
	for _, name := range groups {
		backlog := info.Length
		for _, g := range info.Groups {
			if g.Name == name {
				backlog = g.Lag + g.Pending
			}
		}
		worst = max(worst, backlog)
	}
	return worst, nil
}

// KeyTypes returns the type of each key (TYPE: "none" when it does not exist), in the order of
// keys, in one pipeline.
func (c *Client) KeyTypes(ctx context.Context, keys []string) ([]string, error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*goredis.StatusCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Type(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	types := make([]string, len(keys))
	for i, cmd := range cmds {
		t, err := cmd.Result()
		if err != nil {
			return nil, wrap(err, "reading the type of", keys[i])
		}
		types[i] = t
	}
	return types, nil
}

// StateInfo is what a stateful stage keeps for one partition: State's and Timers' keys.
type StateInfo struct {
	// Keys is the number of fields of the kind's state, the watermark not counted (a field that
	// the kind keeps for itself, such as its count of keys, is).
	Keys int64
	// Watermark is the partition's watermark, Unix ms; 0 when nothing was observed.
	Watermark int64
	// Timers is the number of timers, NextTimer the earliest one's due time (Unix ms; 0: none).
	Timers    int64
	NextTimer int64
	// Bytes is the memory both keys use (MEMORY USAGE); -1 when the server cannot tell.
	Bytes int64
}

// StateStats reads the state of one partition of a stateful stage: its state hash and its timer set.
func (c *Client) StateStats(ctx context.Context, hash, timers string) (StateInfo, error) {
	var info StateInfo
	n, err := c.rdb.HLen(ctx, hash).Result()
	if err != nil {
		return info, wrap(classify(err), "reading state", hash)
	}
	wm, found, err := c.Watermark(ctx, hash)
	if err != nil {
		return info, err
	}
	if found {
		info.Watermark, n = wm, n-1
	}
	info.Keys = n
	if info.Timers, err = c.rdb.ZCard(ctx, timers).Result(); err != nil {
		return info, wrap(classify(err), "reading timers", timers)
	}
	if info.Timers > 0 {
		zs, err := c.rdb.ZRangeWithScores(ctx, timers, 0, 0).Result()
		if err != nil {
			return info, wrap(classify(err), "reading timers", timers)
		}
		if len(zs) > 0 {
			info.NextTimer = int64(zs[0].Score)
		}
	}
	info.Bytes = 0
	for _, key := range []string{hash, timers} {
		b, err := c.rdb.MemoryUsage(ctx, key).Result()
		switch {
		case isNil(err): // no such key
		case err != nil:
			info.Bytes = -1 // miniredis has no MEMORY USAGE
			return info, nil
		default:
			info.Bytes += b
		}
	}
	return info, nil
}

// Watermark reads a stateful stage's own watermark in one partition, the WatermarkField of its
// state hash: Unix ms, and whether the hash has one yet. StateStats (flowrun inspect --state) and the
// runtime's poll of the streams (the live page, the watermark lag metric) read it here.
func (c *Client) Watermark(ctx context.Context, hash string) (int64, bool, error) {
	wm, err := c.rdb.HGet(ctx, hash, WatermarkField).Int64()
	switch {
	case isNil(err):
		return 0, false, nil
	case err != nil:
		return 0, false, wrap(classify(err), "reading the watermark in", hash)
	}
	return wm, true, nil
}

// EvictsKeysWithoutTTL reports the server's maxmemory-policy when it may evict keys that have no time
// to live (allkeys-lru, allkeys-lfu, allkeys-random), such as a stateful stage's state: "" when it
// may not (noeviction, the volatile-* policies). An error means the server would not say (CONFIG
// may be refused to the user).
func (c *Client) EvictsKeysWithoutTTL(ctx context.Context) (string, error) {
	cfg, err := c.rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return "", wrap(classify(err), "reading the maxmemory-policy of", c.desc)
	}
	policy := cfg["maxmemory-policy"]
	if strings.HasPrefix(policy, "allkeys-") {
		return policy, nil
	}
	return "", nil
}
