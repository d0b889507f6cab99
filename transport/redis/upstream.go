package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// UpstreamLag is what a source last reported of the messages its upstream system still holds for
// it (a Kafka group's lag, a JetStream consumer's pending count, an AMQP queue's depth), published
// by the process that runs the source for the processes that only watch it (flowrun inspect). The
// key's value is this struct as JSON (docs/redis-keys.md).
type UpstreamLag struct {
	Lag     int64     `json:"lag"`
	At      time.Time `json:"at"`      // when the process published it
	Process string    `json:"process"` // the process running the source
}

// PublishUpstreamLag sets key to lag, for ttl: a report that is not renewed (the process died,
// the source stopped) goes away rather than going stale.
func (c *Client) PublishUpstreamLag(ctx context.Context, key string, lag UpstreamLag, ttl time.Duration) error {
	raw, err := json.Marshal(lag)
	if err != nil {
		return err
	}
	return wrap(c.rdb.Set(ctx, key, raw, ttl).Err(), "publishing the upstream lag", key)
}

// ReadUpstreamLag reads what PublishUpstreamLag set at key; false when nothing is there.
func (c *Client) ReadUpstreamLag(ctx context.Context, key string) (UpstreamLag, bool, error) {
	raw, err := c.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, goredis.Nil) {
		return UpstreamLag{}, false, nil
	}
	if err != nil {
		return UpstreamLag{}, false, wrap(err, "reading the upstream lag", key)
	}
	var lag UpstreamLag
	if err := json.Unmarshal(raw, &lag); err != nil {
		return UpstreamLag{}, false, fmt.Errorf("redis: %s does not hold an upstream lag: %w", key, err)
	}
	return lag, true, nil
}
