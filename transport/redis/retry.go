package redis

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A retry set (Keys.Retry) holds the messages of one stage on one input partition that wait for
// their next attempt: a sorted set whose members are the messages, scored by the time they are due.
// Messages get there, and leave it, only through Commit's settle step, which also acks their
// input entries: moving a message into the set and acking its entry happen together or not at
// all. A retried message is never written back to its topic, where every other group would see it
// again.

// Retry is a message scheduled to be processed again.
type Retry struct {
	// Entry is the message as it was read; Entry.ID is its ID in the input stream.
	Entry Entry
	// Attempts is the number of attempts made so far.
	Attempts int
	// FirstFailure is when the first attempt failed; LastError what the last one said.
	FirstFailure time.Time
	LastError    string
	// Due is when the next attempt may start.
	Due time.Time

	member string // the stored form, when read from a retry set
}

// retryRecord is a retry's stored form, a JSON object: the member of the sorted set. It holds the
// ID and the attempt number, so no two members are equal.
type retryRecord struct {
	ID           string            `json:"id"`
	Key          string            `json:"key,omitempty"`
	Payload      json.RawMessage   `json:"payload"`
	Headers      map[string]string `json:"headers,omitempty"`
	TraceParent  string            `json:"traceparent,omitempty"`
	TraceState   string            `json:"tracestate,omitempty"`
	Attempts     int               `json:"attempts"`
	FirstFailure int64             `json:"first_failure_ms"`
	LastError    string            `json:"last_error,omitempty"`
}

func (r Retry) encode() (string, error) {
	if !json.Valid(r.Entry.Payload) {
		return "", fmt.Errorf("redis: scheduling a retry of %s: payload is not valid JSON", r.Entry.ID)
	}
	b, err := json.Marshal(retryRecord{
		ID: r.Entry.ID, Key: r.Entry.Key, Payload: r.Entry.Payload, Headers: r.Entry.Headers,
		TraceParent: r.Entry.TraceParent, TraceState: r.Entry.TraceState, Attempts: r.Attempts,
		FirstFailure: r.FirstFailure.UnixMilli(), LastError: r.LastError,
	})
	return string(b), err
}

func decodeRetry(member string, score float64) (Retry, error) {
	var rec retryRecord
	if err := json.Unmarshal([]byte(member), &rec); err != nil || rec.ID == "" || len(rec.Payload) == 0 {
		return Retry{member: member}, fmt.Errorf("redis: malformed retry %q", truncate(member, 80))
	}
	return Retry{
		Entry: Entry{
			ID: rec.ID, Key: rec.Key, Payload: rec.Payload, Headers: rec.Headers,
			TraceParent: rec.TraceParent, TraceState: rec.TraceState,
		},
		Attempts: rec.Attempts, FirstFailure: time.UnixMilli(rec.FirstFailure), LastError: rec.LastError,
		Due: time.UnixMilli(int64(score)), member: member,
	}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// DueRetries returns up to count retries of a retry set that are due at now, earliest first,
// without removing them: Commit's RetryDone removes them once they are handled. A member that
// cannot be decoded comes back in malformed, to be removed (and recorded) by the caller.
func (c *Client) DueRetries(ctx context.Context, key string, now time.Time, count int64) (due []Retry, malformed []Retry, err error) {
	zs, err := c.rdb.ZRangeByScoreWithScores(ctx, key, &goredis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(now.UnixMilli(), 10), Count: count,
	}).Result()
	if err != nil {
		return nil, nil, wrap(err, "reading due retries of", key)
	}
	for _, z := range zs {
		member, _ := z.Member.(string)
		r, derr := decodeRetry(member, z.Score)
		if derr != nil {
			malformed = append(malformed, r)
			continue
		}
		due = append(due, r)
	}
	return due, malformed, nil
}

// NextRetry returns when the earliest retry of a retry set is due, and false when the set is empty.
func (c *Client) NextRetry(ctx context.Context, key string) (time.Time, bool, error) {
	zs, err := c.rdb.ZRangeWithScores(ctx, key, 0, 0).Result()
	if err != nil {
		return time.Time{}, false, wrap(err, "reading the retry set", key)
	}
	if len(zs) == 0 {
		return time.Time{}, false, nil
	}
	return time.UnixMilli(int64(zs[0].Score)), true, nil
}

// AddRetries schedules messages in a retry set without acking anything: the way to replay a dead
// letter to the one stage that gave it up, as no other group reads a stage's retry set.
func (c *Client) AddRetries(ctx context.Context, key string, retries ...Retry) error {
	zs := make([]goredis.Z, 0, len(retries))
	for _, r := range retries {
		member, err := r.encode()
		if err != nil {
			return err
		}
		zs = append(zs, goredis.Z{Score: float64(r.Due.UnixMilli()), Member: member})
	}
	if len(zs) == 0 {
		return nil
	}
	return wrap(c.rdb.ZAdd(ctx, key, zs...).Err(), "scheduling retries in", key)
}
