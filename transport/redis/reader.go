package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Read defaults and limits.
const (
	// DefaultReadCount is the default and maximum COUNT of one group read.
	DefaultReadCount = 1000
	// DefaultBlock is how long a group read waits for new entries by default.
	DefaultBlock = 2 * time.Second
)

// Batch is the result of a read: every entry the read delivered to the consumer, sorted into
// three kinds. All of them are now in the consumer's pending list; the caller acks every ID of
// the batch (IDs) once it has handled it, including malformed and deleted ones, which it
// dead-letters first. Nothing is dropped silently.
type Batch struct {
	// Entries are the decoded entries, in stream order.
	Entries []Entry
	// Malformed are the entries that could not be decoded, in stream order.
	Malformed []*MalformedEntryError
	// Deleted are IDs whose entries were trimmed or deleted from the stream while pending:
	// their contents are gone.
	Deleted []string
	// Redelivered: the entries were delivered before (a consumer's own pending entries read
	// again, or entries taken over from another consumer), so what processed them then may have
	// had its effects outside Redis already.
	Redelivered bool
}

// Len returns the number of IDs in the batch.
func (b Batch) Len() int { return len(b.Entries) + len(b.Malformed) + len(b.Deleted) }

// IDs returns every ID of the batch: entries, malformed entries and deleted IDs.
func (b Batch) IDs() []string {
	ids := make([]string, 0, b.Len())
	for _, e := range b.Entries {
		ids = append(ids, e.ID)
	}
	for _, m := range b.Malformed {
		ids = append(ids, m.ID)
	}
	return append(ids, b.Deleted...)
}

// add sorts one message into the batch; an entry larger than maxSize bytes (0: no limit) is
// malformed.
func (b *Batch) add(msg goredis.XMessage, maxSize int64) {
	if msg.Values == nil {
		b.Deleted = append(b.Deleted, msg.ID)
		return
	}
	e, err := decodeEntry(msg, maxSize)
	if err != nil {
		var m *MalformedEntryError
		if errors.As(err, &m) {
			b.Malformed = append(b.Malformed, m)
			return
		}
		b.Malformed = append(b.Malformed, &MalformedEntryError{ID: msg.ID, Reason: err.Error()})
		return
	}
	b.Entries = append(b.Entries, e)
}

// ReadArgs select a group read.
type ReadArgs struct {
	Stream   string
	Group    string
	Consumer string
	// Count is the maximum number of entries; default and maximum DefaultReadCount.
	Count int64
	// Block is how long to wait for entries when there are none: 0 means DefaultBlock, a
	// negative value means do not wait. The read holds a pool connection while it waits.
	Block time.Duration
}

func (a ReadArgs) validate() (ReadArgs, error) {
	if a.Stream == "" || a.Group == "" || a.Consumer == "" {
		return a, fmt.Errorf("redis: read needs a stream, a group and a consumer (got %q, %q, %q)", a.Stream, a.Group, a.Consumer)
	}
	switch {
	case a.Count <= 0:
		a.Count = DefaultReadCount
	case a.Count > DefaultReadCount:
		return a, fmt.Errorf("redis: read count %d is above the maximum %d", a.Count, DefaultReadCount)
	}
	if a.Block == 0 {
		a.Block = DefaultBlock
	}
	return a, nil
}

// ReadGroup reads entries never delivered to the group (XREADGROUP ... >), waiting up to
// a.Block for some to arrive. It returns an empty batch when none arrived. The entries are now
// pending for a.Consumer until acked (see Commit). A missing group or stream is an error
// wrapping ErrNoGroup.
func (c *Client) ReadGroup(ctx context.Context, a ReadArgs) (Batch, error) {
	a, err := a.validate()
	if err != nil {
		return Batch{}, err
	}
	return c.readGroup(ctx, a, ">", a.Block)
}

// ReadPending re-reads the consumer's own pending entries with IDs greater than after (""
// means from the start), up to a.Count of them, without waiting. It is the recovery step of a
// consumer that restarts under the same name, run once at start-up and paged by passing the
// last ID returned: an empty batch means the end. The entries keep the delivery counts they had
// (Entry.Deliveries; keepOwnCounts): reading them again is no new delivery. Do not call it on every loop: each re-read
// resets the entries' idle time, so a stuck entry would never become old enough for Reclaim.
// Entries deleted from the stream while pending come back in Batch.Deleted.
func (c *Client) ReadPending(ctx context.Context, a ReadArgs, after string) (Batch, error) {
	a, err := a.validate()
	if err != nil {
		return Batch{}, err
	}
	if after == "" {
		after = "0"
	}
	b, err := c.readGroup(ctx, a, after, -1)
	if err != nil || len(b.Entries) == 0 {
		b.Redelivered = true
		return b, err
	}
	b.Redelivered = true
	// Reading them again counted a delivery of each: take it back (keepOwnCounts).
	counts := make(map[string]int64, len(b.Entries))
	if err := c.fillDeliveries(ctx, ReclaimArgs{Stream: a.Stream, Group: a.Group, Consumer: a.Consumer}, b.Entries); err != nil {
		return b, err
	}
	for i := range b.Entries {
		if n := b.Entries[i].Deliveries; n > 1 {
			counts[b.Entries[i].ID] = n - 1
		}
	}
	return b, c.keepOwnCounts(ctx, a.Stream, a.Group, a.Consumer, b.Entries, counts)
}

func (c *Client) readGroup(ctx context.Context, a ReadArgs, id string, block time.Duration) (Batch, error) {
	if c.clocked != nil && block >= 0 {
		return c.clockedRead(ctx, a, id, block)
	}
	return c.readGroupOnce(ctx, a, id, block)
}

func (c *Client) readGroupOnce(ctx context.Context, a ReadArgs, id string, block time.Duration) (Batch, error) {
	if block < 0 {
		block = -1 // go-redis: a negative Block sends no BLOCK argument
	}
	if c.rawReadable(block) {
		return c.readGroupRaw(ctx, a, id, block)
	}
	res, err := c.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group:    a.Group,
		Consumer: a.Consumer,
		Streams:  []string{a.Stream, id},
		Count:    a.Count,
		Block:    block,
	}).Result()
	if isNil(err) {
		return Batch{}, nil
	}
	if err != nil {
		return Batch{}, wrap(classify(err), "reading group "+a.Group+" of", a.Stream)
	}
	var b Batch
	if len(res) == 1 { // one stream read: its entries, sized at once rather than grown by appends
		b.Entries = make([]Entry, 0, len(res[0].Messages))
	}
	for _, s := range res {
		if err := c.fetchPayloads(ctx, s.Stream, s.Messages); err != nil {
			return Batch{}, err
		}
		for _, msg := range s.Messages {
			b.add(msg, c.maxEntrySize)
		}
	}
	return b, nil
}
