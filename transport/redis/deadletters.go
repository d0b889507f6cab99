package redis

import (
	"context"
	"errors"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Dead-letter streams are streams like any other; these functions serve the tools that list, replay
// and purge them (flowrun dlq). Replayed entries are marked in a hash next to their stream
// (Keys.Replayed), entry ID to the time of the replay, so that a listing shows what was done.

// Replayed returns the key of the hash that marks the replayed entries of a dead-letter stream:
// "<stream>:replayed", in the stream's hash slot.
func (k Keys) Replayed(stream string) string { return stream + ":replayed" }

// EntryByID returns the entry with the given ID, and false when the stream has none.
func (c *Client) EntryByID(ctx context.Context, stream, id string) (Record, bool, error) {
	msgs, err := c.rdb.XRangeN(ctx, stream, id, id, 1).Result()
	if err != nil {
		return Record{}, false, wrap(err, "reading entry "+id+" of", stream)
	}
	if len(msgs) == 0 {
		return Record{}, false, nil
	}
	if err := c.fetchPayloads(ctx, stream, msgs); err != nil {
		return Record{}, false, err
	}
	return recordOf(msgs[0]), true, nil
}

// DeleteEntries removes entries from a stream (XDEL), with their offloaded payloads, and returns
// how many there were.
func (c *Client) DeleteEntries(ctx context.Context, stream string, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := deleteEntriesScript.Run(ctx, c.rdb, []string{stream, PayloadIndex(stream)}, stringsToAny(ids)...).Int64()
	return n, wrap(err, "deleting entries of", stream)
}

func stringsToAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// MarkReplayed records that entries were replayed at the given time.
func (c *Client) MarkReplayed(ctx context.Context, key string, at time.Time, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	values := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		values = append(values, id, at.UTC().Format(time.RFC3339Nano))
	}
	return wrap(c.rdb.HSet(ctx, key, values...).Err(), "marking replayed entries in", key)
}

// ReplayedAt returns the replay times recorded in a replay hash, by entry ID.
func (c *Client) ReplayedAt(ctx context.Context, key string) (map[string]time.Time, error) {
	m, err := c.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, wrap(err, "reading replayed entries in", key)
	}
	out := make(map[string]time.Time, len(m))
	for id, at := range m {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err == nil {
			out[id] = t
		}
	}
	return out, nil
}

// ForgetReplayed removes replay marks, those of the given IDs or, with none, all of them.
func (c *Client) ForgetReplayed(ctx context.Context, key string, ids ...string) error {
	var err error
	if len(ids) == 0 {
		err = c.rdb.Del(ctx, key).Err()
	} else {
		err = c.rdb.HDel(ctx, key, ids...).Err()
	}
	return wrap(err, "forgetting replayed entries in", key)
}

// DeleteStream removes a stream and everything in it, offloaded payloads included.
func (c *Client) DeleteStream(ctx context.Context, stream string) error {
	err := deleteStreamScript.Run(ctx, c.rdb, []string{stream, PayloadIndex(stream)}).Err()
	return wrap(err, "deleting", stream)
}

// recordOf decodes a message read without a group: a malformed one is returned with its reason.
func recordOf(msg goredis.XMessage) Record {
	e, err := DecodeEntry(msg)
	if err == nil {
		return Record{Entry: e}
	}
	var m *MalformedEntryError
	if !errors.As(err, &m) {
		m = &MalformedEntryError{ID: msg.ID, Reason: err.Error()}
	}
	return Record{Entry: Entry{ID: msg.ID}, Malformed: m}
}
