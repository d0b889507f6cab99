package redis

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Each partition of a topic whose watermarks a stateful stage needs has a hash of its writers'
// watermarks, in the partition's slot: Keys.Watermarks. Each writer (a source, or a stage on one
// of its input partitions) sets its fields with the commit that writes its outputs, after them, so
// that a reader that reads the hash and then the stream's last entry, and has processed the stream
// up to that entry, has seen everything the writer wrote before the watermark it read. A field is
// "<writer>|<domain>": the writer's name ("source.NAME", "stage.NAME:PARTITION") and the event time
// it is the watermark of (the expression's text, "" for the entry's time). Its value is a Mark.

// Mark is a writer's watermark in one domain, as its field of a watermarks hash holds it.
type Mark struct {
	At int64 // Unix ms; 0 with !Idle: none yet
	// Idle says that the writer has had nothing to say for its idle timeout before it had a
	// watermark: its readers leave it out of their minimum.
	Idle bool
	// Closed says that the writer will write nothing more in this job (its inputs are drained):
	// its readers take it as later than any time. At and Idle keep what it said before.
	Closed bool
}

// String encodes the mark: "1700000000000", "idle", "", or any of them after "closed:".
func (m Mark) String() string {
	var s string
	switch {
	case m.At != 0:
		s = strconv.FormatInt(m.At, 10)
	case m.Idle:
		s = "idle"
	}
	if m.Closed {
		return "closed:" + s
	}
	return s
}

// ParseMark decodes a mark (String).
func ParseMark(s string) (Mark, error) {
	var m Mark
	if rest, ok := strings.CutPrefix(s, "closed:"); ok {
		m.Closed, s = true, rest
	}
	switch s {
	case "":
	case "idle":
		m.Idle = true
	default:
		at, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Mark{}, fmt.Errorf("the watermark %q is not a time in Unix ms", s)
		}
		m.At = at
	}
	return m, nil
}

// MarkField names a writer's field of a watermarks hash.
func MarkField(writer, domain string) string { return writer + "|" + domain }

// Watermarks returns the key of the hash of the watermarks of the writers of partition p of a
// topic: "<prefix>:{<topic>:<p>}:watermarks".
func (k Keys) Watermarks(topic string, partition int) string {
	return k.Stream(topic, partition) + ":watermarks"
}

// MarkWrite sets fields of a watermarks hash: a writer's marks, with a commit (CommitArgs.Marks).
type MarkWrite struct {
	Hash   string
	Fields map[string]string // field -> Mark.String()
}

// ReadMarks returns the fields of a partition's watermarks hash and then the ID of the last entry
// of its stream, in one round trip ("0-0" when the stream has none): everything written before
// the marks were set is at or before that ID.
func (c *Client) ReadMarks(ctx context.Context, hash, stream string) (map[string]string, string, error) {
	pipe := c.rdb.Pipeline()
	marks := pipe.HGetAll(ctx, hash)
	last := pipe.XRevRangeN(ctx, stream, "+", "-", 1)
	_, _ = pipe.Exec(ctx)
	fields, err := marks.Result()
	if err != nil {
		return nil, "", wrap(classify(err), "reading the watermarks in", hash)
	}
	msgs, err := last.Result()
	if err != nil {
		return nil, "", wrap(classify(err), "reading the last entry of", stream)
	}
	if len(msgs) == 0 {
		return fields, zeroID.String(), nil
	}
	return fields, msgs[0].ID, nil
}

// reopenScript takes back the closes of a watermarks hash: each "closed:X" becomes X again (and
// "closed:" goes), so that a new run does not take the end of the last job for its own.
//
//	KEYS[1] watermarks hash; returns the number of fields reopened
var reopenScript = goredis.NewScript(`
local f = redis.call('HGETALL', KEYS[1])
local n = 0
for i = 1, #f, 2 do
  local v = f[i + 1]
  if string.sub(v, 1, 7) == 'closed:' then
    local was = string.sub(v, 8)
    if was == '' then
      redis.call('HDEL', KEYS[1], f[i])
    else
      redis.call('HSET', KEYS[1], f[i], was)
    end
    n = n + 1
  end
end
return n
`)

// ReopenMarks takes back the closes of the given watermarks hashes (see reopenScript), in one round
// trip per server.
func (c *Client) ReopenMarks(ctx context.Context, hashes []string) error {
	pipe := c.rdb.Pipeline()
	cmds := make([]*goredis.Cmd, len(hashes))
	for i, h := range hashes {
		cmds[i] = reopenScript.Eval(ctx, pipe, []string{h})
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return wrap(classify(err), "reopening the watermarks in", hashes[i])
		}
	}
	return nil
}

// WriteMarks sets watermarks fields outside a commit (a source's idle watermark), in one round
// trip per server.
func (c *Client) WriteMarks(ctx context.Context, marks []MarkWrite) error {
	if len(marks) == 0 {
		return nil
	}
	pipe := c.rdb.Pipeline()
	collect := queueMarks(ctx, pipe, marks)
	_, _ = pipe.Exec(ctx)
	return collect()
}

// queueMarks adds the HSETs of marks to a pipeline and returns a function that reports the first
// that failed, after Exec.
func queueMarks(ctx context.Context, pipe goredis.Pipeliner, marks []MarkWrite) func() error {
	cmds := make([]*goredis.IntCmd, len(marks))
	for i, m := range marks {
		if len(m.Fields) == 0 {
			continue
		}
		cmds[i] = pipe.HSet(ctx, m.Hash, markArgs(m)...)
	}
	return func() error {
		for i, cmd := range cmds {
			if cmd == nil {
				continue
			}
			if err := cmd.Err(); err != nil {
				return wrap(classify(err), "writing the watermarks in", marks[i].Hash)
			}
		}
		return nil
	}
}

// markArgs are a mark write's field/value pairs, in field order (scripts and tests see them the
// same way every time).
func markArgs(m MarkWrite) []any {
	args := make([]any, 0, 2*len(m.Fields))
	for _, f := range slices.Sorted(maps.Keys(m.Fields)) {
		args = append(args, f, m.Fields[f])
	}
	return args
}

// Holds returns up to n holds of a holds set (StateWrites.HoldsKey), earliest first, with their
// times in Unix ms.
func (c *Client) Holds(ctx context.Context, key string, n int64) ([]DueTimer, error) {
	zs, err := c.rdb.ZRangeWithScores(ctx, key, 0, n-1).Result()
	if err != nil {
		return nil, wrap(classify(err), "reading the holds in", key)
	}
	out := make([]DueTimer, len(zs))
	for i, z := range zs {
		name, _ := z.Member.(string)
		out[i] = DueTimer{Name: name, At: int64(z.Score)}
	}
	return out, nil
}

// ReadMarkFields returns the values of fields[i] of hashes[i] ("" for none), in one round trip per
// server: the marks a job's end test looks at.
func (c *Client) ReadMarkFields(ctx context.Context, hashes, fields []string) ([]string, error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*goredis.StringCmd, len(hashes))
	for i := range hashes {
		cmds[i] = pipe.HGet(ctx, hashes[i], fields[i])
	}
	_, _ = pipe.Exec(ctx)
	out := make([]string, len(hashes))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil && !isNil(err) {
			return nil, wrap(classify(err), "reading the watermarks in", hashes[i])
		}
		out[i] = v
	}
	return out, nil
}
