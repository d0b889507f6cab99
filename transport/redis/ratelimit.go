package redis

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A rate limit is one string key per limited key, shared by every process that runs the pipeline:
// the theoretical arrival time (TAT) of the generic cell rate algorithm, in Unix microseconds. A
// message may go at now when TAT - now <= (burst - 1) * interval; going moves TAT on by interval
// (from now, when TAT has fallen behind). So at most burst messages go at once after a quiet
// spell, and one every interval after them, whatever process asks.
//
// The caller gives the time (its clock: a virtual one in flowrun test), so that every process
// should run on synchronised clocks; a clock that is ahead by s lets its process's messages go up
// to s late, one that is behind makes them wait up to s longer, never more often than the limit.
// A key that is not asked for lapses (PX) once its TAT has passed, plus a minute.

// rateLimitScript takes a turn from a rate limit, or says how long to wait.
//
//	KEYS[1] the limit's key; ARGV[1] now (Unix µs), ARGV[2] interval (µs, may be fractional),
//	ARGV[3] burst (>= 1)
//	returns 0 when the turn was taken, else the wait in µs (at least 1), having taken nothing
var rateLimitScript = goredis.NewScript(`
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then
  tat = now
end
local at = tat - (burst - 1) * interval
if at > now then
  return math.ceil(at - now)
end
local next = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', next), 'PX', math.ceil((next - now) / 1000) + 60000)
return 0
`)

// TakeRate takes a turn for one message from the rate limit at key, which lets burst messages go at
// once and then one every interval, at the time now: it returns 0 when the message may go, or how
// long to wait before asking again (nothing was taken then).
func (c *Client) TakeRate(ctx context.Context, key string, now time.Time, interval time.Duration, burst int64) (time.Duration, error) {
	if interval <= 0 || burst < 1 {
		return 0, fmt.Errorf("redis: rate limit %s: interval %s and burst %d must be positive", key, interval, burst)
	}
	us := strconv.FormatFloat(float64(interval)/float64(time.Microsecond), 'f', -1, 64)
	wait, err := rateLimitScript.Run(ctx, c.rdb, []string{key}, now.UnixMicro(), us, burst).Int64()
	if err != nil {
		return 0, err
	}
	if wait <= 0 {
		return 0, nil
	}
	return time.Duration(min(wait, math.MaxInt64/int64(time.Microsecond))) * time.Microsecond, nil
}
