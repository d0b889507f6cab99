package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Reads without a consumer group, for tools that watch a stream (flowrun tail): they change
// nothing that a stage sees, no group, no pending entry, no delivery count.

// Record is an entry as Read returns it: decoded, or, when it cannot be decoded, with Malformed
// saying why (Entry then holds only the ID).
type Record struct {
	Entry
	// Malformed is non-nil for an entry that cannot be decoded: its reason and raw fields.
	Malformed *MalformedEntryError
}

// Read returns up to count entries of stream whose IDs are greater than after, in stream order,
// with a plain XREAD (no consumer group). after is a stream ID, "<ms>-<seq>" or "<ms>": "0" reads
// from the start, and LastID gives the ID after which only entries added from now on come. count
// <= 0 means DefaultReadCount, which is also the maximum.
//
// When there is no entry after after, Read waits up to block for one to arrive and returns none if
// none came; block <= 0 returns at once. The wait holds a pool connection and does not watch ctx
// once the command is sent (ctx's deadline still bounds it): closing the Client ends it at once.
//
// A stream that does not exist reads as empty. An entry that cannot be decoded is returned with
// Malformed set, in its place, never as an error.
func (c *Client) Read(ctx context.Context, stream, after string, count int64, block time.Duration) ([]Record, error) {
	if stream == "" {
		return nil, fmt.Errorf("redis: read needs a stream")
	}
	if _, err := parseID(after); err != nil {
		return nil, fmt.Errorf("redis: reading %s after %q: want a stream ID such as 0 or 1700000000000-0", stream, after)
	}
	switch {
	case count <= 0:
		count = DefaultReadCount
	case count > DefaultReadCount:
		return nil, fmt.Errorf("redis: read count %d is above the maximum %d", count, DefaultReadCount)
	}
	if block <= 0 {
		block = -1 // go-redis: a negative Block sends no BLOCK argument; 0 would wait forever
	}
	res, err := c.rdb.XRead(ctx, &goredis.XReadArgs{Streams: []string{stream, after}, Count: count, Block: block}).Result()
	if isNil(err) {
		return nil, nil // nothing arrived in time, or no such stream
	}
	if err != nil {
		return nil, wrap(err, "reading", stream)
	}
	var out []Record
	for _, s := range res {
		if err := c.fetchPayloads(ctx, s.Stream, s.Messages); err != nil {
			return nil, err
		}
		for _, msg := range s.Messages {
			e, err := DecodeEntry(msg)
			if err != nil {
				var m *MalformedEntryError
				if !errors.As(err, &m) {
					m = &MalformedEntryError{ID: msg.ID, Reason: err.Error()}
				}
				out = append(out, Record{Entry: Entry{ID: msg.ID}, Malformed: m})
				continue
			}
			out = append(out, Record{Entry: e})
		}
	}
	return out, nil
}

// LastID returns the ID of the last entry of stream, or "0-0" when it has none or does not exist:
// Read after it returns only the entries added later.
func (c *Client) LastID(ctx context.Context, stream string) (string, error) {
	msgs, err := c.rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil {
		return "", wrap(err, "reading the last entry of", stream)
	}
	if len(msgs) == 0 {
		return zeroID.String(), nil
	}
	return msgs[0].ID, nil
}

// StreamLen returns the number of entries of a stream (XLEN), 0 when it does not exist. For the
// full picture of a partition, with its groups, see StreamStats.
func (c *Client) StreamLen(ctx context.Context, stream string) (int64, error) {
	n, err := c.rdb.XLen(ctx, stream).Result()
	if err != nil {
		return 0, wrap(err, "reading the length of", stream)
	}
	return n, nil
}
