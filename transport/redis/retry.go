package redis

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// claimRetriesScript takes the due members of a retry set and moves their score to the end of the
// hold, returning them with their original due times.
//
//	KEYS[1] retry set; ARGV[1] now in ms, ARGV[2] count, ARGV[3] end of the hold in ms
//	returns member, score, member, score, ...
var claimRetriesScript = goredis.NewScript(`
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
for i = 1, #due, 2 do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], due[i])
end
return due
`)

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
	// Stage, for a message of a fused chain (flow.Chain), is the stage of the chain whose attempt
	// failed: the next attempt starts there, with the message as the stage before it made it. Empty:
	// the retry set's own node. Path tells apart messages a chain's stages made of one entry.
	Stage, Path string

	member string // the stored form, when read from a retry set
}

// retryRecord is a retry's stored form, a JSON object: the member of the sorted set. It holds the
// ID and the attempt number, so no two members are equal.
type retryRecord struct {
	ID          string            `json:"id"`
	Key         string            `json:"key,omitempty"`
	Payload     json.RawMessage   `json:"payload"`
	Headers     map[string]string `json:"headers,omitempty"`
	TraceParent string            `json:"traceparent,omitempty"`
	TraceState  string            `json:"tracestate,omitempty"`
	// TraceDropped keeps Entry.TraceDropped: the message arrived with an invalid traceparent, so a
	// traced node starts a trace for it on every attempt, as it did on the first.
	TraceDropped bool   `json:"trace_dropped,omitempty"`
	Attempts     int    `json:"attempts"`
	FirstFailure int64  `json:"first_failure_ms"`
	LastError    string `json:"last_error,omitempty"`
	Stage        string `json:"stage,omitempty"`
	Path         string `json:"path,omitempty"`
}

func (r Retry) encode() (string, error) {
	if !json.Valid(r.Entry.Payload) {
		return "", fmt.Errorf("redis: scheduling a retry of %s: payload is not valid JSON", r.Entry.ID)
	}
	b, err := json.Marshal(retryRecord{
		ID: r.Entry.ID, Key: r.Entry.Key, Payload: r.Entry.Payload, Headers: r.Entry.Headers,
		TraceParent: r.Entry.TraceParent, TraceState: r.Entry.TraceState, TraceDropped: r.Entry.TraceDropped, Attempts: r.Attempts,
		FirstFailure: r.FirstFailure.UnixMilli(), LastError: r.LastError, Stage: r.Stage, Path: r.Path,
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
			TraceParent: rec.TraceParent, TraceState: rec.TraceState, TraceDropped: rec.TraceDropped,
		},
		Attempts: rec.Attempts, FirstFailure: time.UnixMilli(rec.FirstFailure), LastError: rec.LastError,
		Due: time.UnixMilli(int64(score)), Stage: rec.Stage, Path: rec.Path, member: member,
	}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// ClaimRetries takes up to count retries of a retry set that are due at now, earliest first, and
// holds them for the caller: in the same script their due time moves to now+hold, so that no other
// consumer of the set (processes sharing a partition without a lease, or a process that just lost
// it) takes them meanwhile. Commit's RetryDone removes them once they are handled; a caller that
// dies leaves them to be taken again when the hold ends. A member that cannot be decoded, or whose
// entry is larger than the client's limit (WithMaxEntrySize), comes back in malformed, to be
// removed (and recorded) by the caller.
func (c *Client) ClaimRetries(ctx context.Context, key string, now time.Time, count int64, hold time.Duration) (due []Retry, malformed []Retry, err error) {
	res, err := claimRetriesScript.Run(ctx, c.rdb, []string{key}, now.UnixMilli(), count, now.Add(hold).UnixMilli()).StringSlice()
	if err != nil {
		return nil, nil, wrap(err, "claiming due retries of", key)
	}
	for i := 0; i+1 < len(res); i += 2 {
		score, perr := strconv.ParseFloat(res[i+1], 64)
		r, derr := decodeRetry(res[i], score)
		if c.maxEntrySize > 0 && derr == nil && EntrySize(r.Entry) > c.maxEntrySize {
			derr = fmt.Errorf("redis: retry of %s is larger than %d bytes", r.Entry.ID, c.maxEntrySize)
		}
		if perr != nil || derr != nil {
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
