package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Reclaim defaults.
const (
	// DefaultClaimPageSize is the default COUNT of one XAUTOCLAIM page.
	DefaultClaimPageSize = 100
	// DefaultClaimMaxPages is the default number of pages one Reclaim call reads.
	DefaultClaimMaxPages = 10
)

// ReclaimArgs select a reclaim of idle pending entries.
type ReclaimArgs struct {
	Stream   string
	Group    string
	Consumer string // the consumer that takes the entries
	// MinIdle is how long an entry must have been idle (not delivered or claimed) to be taken.
	// It must be at least 1ms: 0 would take entries other consumers are working on right now.
	MinIdle time.Duration
	// PageSize is the COUNT of each XAUTOCLAIM; default DefaultClaimPageSize.
	PageSize int64
	// MaxPages bounds the pages read by one call; default DefaultClaimMaxPages.
	MaxPages int
	// Start is the cursor to start from; "" or "0-0" means the beginning of the pending list.
	Start string
}

// ReclaimResult is what one Reclaim call took.
type ReclaimResult struct {
	// Batch holds the claimed entries (now pending for the caller's consumer) with their
	// delivery counts in Entry.Deliveries (including this delivery), the claimed entries that
	// could not be decoded, and, in Deleted, the pending IDs whose entries had been trimmed or
	// deleted (Redis removed them from the pending list; they cannot be processed and should be
	// dead-lettered by ID).
	Batch
	// Next is the cursor to continue from on the next call; "0-0" when the whole pending list
	// was scanned.
	Next string
}

// Reclaim takes pending entries idle for at least MinIdle from any consumer of the group, with
// XAUTOCLAIM, following the cursor until it returns to 0-0 or MaxPages pages were read. It
// fetches the delivery counts of the claimed entries with one XPENDING range call per page
// (XAUTOCLAIM does not return them): reclaim runs on a timer, never on the steady-state path.
//
// Entries that were pending for the claiming consumer itself keep their delivery counts
// (keepOwnCounts): taking back what it had is no new delivery.
//
// The deleted IDs need Redis 7 (XAUTOCLAIM's third reply element). miniredis does not report
// them: there, a pending entry whose stream entry is gone is skipped silently, and stays pending.
func (c *Client) Reclaim(ctx context.Context, a ReclaimArgs) (ReclaimResult, error) {
	if a.Stream == "" || a.Group == "" || a.Consumer == "" {
		return ReclaimResult{}, fmt.Errorf("redis: reclaim needs a stream, a group and a consumer (got %q, %q, %q)", a.Stream, a.Group, a.Consumer)
	}
	if a.MinIdle < time.Millisecond {
		return ReclaimResult{}, fmt.Errorf("redis: reclaim min idle %s is below 1ms: it would take entries that other consumers are processing", a.MinIdle)
	}
	if a.PageSize <= 0 {
		a.PageSize = DefaultClaimPageSize
	}
	if a.MaxPages <= 0 {
		a.MaxPages = DefaultClaimMaxPages
	}
	cursor := a.Start
	if cursor == "" {
		cursor = "0-0"
	}
	own, err := c.ownPending(ctx, a.Stream, a.Group, a.Consumer, a.MinIdle, a.PageSize*int64(a.MaxPages))
	if err != nil {
		return ReclaimResult{}, err
	}
	var res ReclaimResult
	for page := 0; page < a.MaxPages; page++ {
		msgs, next, deleted, err := c.rdb.XAutoClaimWithDeleted(ctx, &goredis.XAutoClaimArgs{
			Stream:   a.Stream,
			Group:    a.Group,
			Consumer: a.Consumer,
			MinIdle:  a.MinIdle,
			Start:    cursor,
			Count:    a.PageSize,
		}).Result()
		if err != nil {
			return res, wrap(classify(err), "reclaiming from group "+a.Group+" of", a.Stream)
		}
		if err := c.fetchPayloads(ctx, a.Stream, msgs); err != nil {
			return res, err
		}
		var b Batch
		for _, m := range msgs {
			b.add(m, c.maxEntrySize)
		}
		b.Deleted = append(b.Deleted, deleted...)
		if len(b.Entries) > 0 {
			if err := c.fillDeliveries(ctx, a, b.Entries); err != nil {
				return res, err
			}
			if err := c.keepOwnCounts(ctx, a.Stream, a.Group, a.Consumer, b.Entries, own); err != nil {
				return res, err
			}
		}
		res.Entries = append(res.Entries, b.Entries...)
		res.Malformed = append(res.Malformed, b.Malformed...)
		res.Deleted = append(res.Deleted, b.Deleted...)
		cursor = next
		if next == "0-0" || next == "" {
			cursor = "0-0"
			break
		}
	}
	res.Next = cursor
	res.Redelivered = true
	return res, nil
}

// fillDeliveries sets Deliveries of freshly claimed entries from the consumer's pending list.
// The consumer may have other pending entries within the range, so it pages until every claimed
// ID is found or the range is exhausted.
func (c *Client) fillDeliveries(ctx context.Context, a ReclaimArgs, entries []Entry) error {
	want := make(map[string]*Entry, len(entries))
	for i := range entries {
		want[entries[i].ID] = &entries[i]
	}
	start, end := entries[0].ID, entries[len(entries)-1].ID
	count := int64(len(entries))
	for len(want) > 0 {
		pend, err := c.rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{
			Stream:   a.Stream,
			Group:    a.Group,
			Start:    start,
			End:      end,
			Count:    count,
			Consumer: a.Consumer,
		}).Result()
		if err != nil {
			return wrap(classify(err), "reading delivery counts of group "+a.Group+" on", a.Stream)
		}
		for _, p := range pend {
			if e, ok := want[p.ID]; ok {
				e.Deliveries = p.RetryCount
				delete(want, p.ID)
			}
		}
		if int64(len(pend)) < count {
			break // range exhausted; entries acked meanwhile keep Deliveries 0
		}
		last, err := parseID(pend[len(pend)-1].ID)
		if err != nil {
			return err
		}
		start = last.next().String()
	}
	return nil
}

// ownPending returns the delivery counts, by ID, of up to count entries pending for consumer itself
// and idle for at least minIdle: those that a reclaim by consumer takes back.
func (c *Client) ownPending(ctx context.Context, stream, group, consumer string, minIdle time.Duration, count int64) (map[string]int64, error) {
	pend, err := c.rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{
		Stream: stream, Group: group, Idle: minIdle, Start: "-", End: "+", Count: count, Consumer: consumer,
	}).Result()
	if err != nil {
		return nil, wrap(classify(err), "reading the pending entries of "+consumer+" in group "+group+" on", stream)
	}
	own := make(map[string]int64, len(pend))
	for _, p := range pend {
		own[p.ID] = p.RetryCount
	}
	return own, nil
}

// keepOwnCounts sets the delivery counts of entries that consumer had pending before it read or
// claimed them again back to what they were before (before: by ID), in Redis and in entries. A
// delivery count is how many times an entry was handed to a consumer: a consumer taking back what
// it had (a process that lost a partition's lease and took it again, or read its own pending
// entries again after a commit failed) hands nothing to anyone. Without this, a live process whose
// leases come and go on a loaded machine would see its entries reach the poison limit.
func (c *Client) keepOwnCounts(ctx context.Context, stream, group, consumer string, entries []Entry, before map[string]int64) error {
	byCount := map[int64][]any{}
	for i := range entries {
		if n, ok := before[entries[i].ID]; ok && entries[i].Deliveries != n {
			entries[i].Deliveries = n
			byCount[n] = append(byCount[n], entries[i].ID)
		}
	}
	for n, ids := range byCount {
		// XCLAIM with JUSTID does not count a delivery; RETRYCOUNT sets the count.
		args := append(append([]any{"XCLAIM", stream, group, consumer, 0}, ids...), "RETRYCOUNT", n, "JUSTID")
		if err := c.rdb.Do(ctx, args...).Err(); err != nil {
			return wrap(classify(err), "keeping the delivery counts of group "+group+" on", stream)
		}
	}
	return nil
}
