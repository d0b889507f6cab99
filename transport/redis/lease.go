package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ErrLeaseLost is returned (wrapped) when a lease is no longer held by the caller: it expired
// and was taken by another owner, or was released. A worker that sees it must stop working on
// the partition without acking.
var ErrLeaseLost = errors.New("lease lost")

// Lease is a held lease: the key, the owner that holds it and its fencing token. Tokens come
// from a counter that only grows (LeaseFence of the key), so a later holder always has a larger
// token than an earlier one.
//
// The value stored in Redis is "<owner>#<token>", so `redis-cli GET <key>` shows who holds it.
type Lease struct {
	Key   string
	Owner string
	Token int64
}

// Value returns the lease's value in Redis, "<owner>#<token>".
func (l Lease) Value() string { return l.Owner + "#" + strconv.FormatInt(l.Token, 10) }

func (l Lease) String() string { return l.Key + "=" + l.Value() }

// parseLeaseValue splits "<owner>#<token>"; the owner may itself contain '#'.
func parseLeaseValue(key, v string) (Lease, error) {
	i := strings.LastIndexByte(v, '#')
	if i < 0 {
		return Lease{}, fmt.Errorf("redis: lease %s has value %q, want <owner>#<token>", key, v)
	}
	tok, err := strconv.ParseInt(v[i+1:], 10, 64)
	if err != nil {
		return Lease{}, fmt.Errorf("redis: lease %s has value %q, want <owner>#<token>", key, v)
	}
	return Lease{Key: key, Owner: v[:i], Token: tok}, nil
}

func leaseTTL(ttl time.Duration) (int64, error) {
	ms := ttl.Milliseconds()
	if ms < 1 {
		return 0, fmt.Errorf("redis: lease ttl %s is below 1ms", ttl)
	}
	return ms, nil
}

// AcquireLease takes the lease at key for owner with the given time to live (at least 1ms), if
// nobody holds it. Taking it and drawing a new fencing token happen in one script, so a lease
// never exists without expiry.
//
// It returns (the new lease, true) when taken, and (the current holder's lease, false) when
// someone holds it, the owner itself included: leases are not re-entrant, an owner extends its
// lease with RenewLease. owner must be non-empty and should be unique per process run.
func (c *Client) AcquireLease(ctx context.Context, key, owner string, ttl time.Duration) (Lease, bool, error) {
	if owner == "" {
		return Lease{}, false, errors.New("redis: acquiring lease: empty owner")
	}
	ms, err := leaseTTL(ttl)
	if err != nil {
		return Lease{}, false, err
	}
	res, err := acquireLeaseScript.Run(ctx, c.rdb, []string{key, LeaseFence(key)}, owner, ms).Slice()
	if err != nil {
		return Lease{}, false, wrap(err, "acquiring lease", key)
	}
	if len(res) != 3 {
		return Lease{}, false, fmt.Errorf("redis: acquiring lease %s: unexpected reply %v", key, res)
	}
	l, err := parseLeaseValue(key, toString(res[1]))
	if err != nil {
		return Lease{}, false, err
	}
	taken, _ := res[0].(int64)
	return l, taken == 1, nil
}

// RenewLease extends a held lease to ttl from now. It returns an error wrapping ErrLeaseLost if
// the lease is no longer l (expired, released or taken by another owner).
func (c *Client) RenewLease(ctx context.Context, l Lease, ttl time.Duration) error {
	ms, err := leaseTTL(ttl)
	if err != nil {
		return err
	}
	n, err := renewLeaseScript.Run(ctx, c.rdb, []string{l.Key}, l.Value(), ms).Int()
	if err != nil {
		return wrap(err, "renewing lease", l.Key)
	}
	if n != 1 {
		return fmt.Errorf("redis: renewing lease %s as %s: %w", l.Key, l.Value(), ErrLeaseLost)
	}
	return nil
}

// ReleaseLease deletes a held lease so that another owner can take it at once. It returns an
// error wrapping ErrLeaseLost, and deletes nothing, if the lease is no longer l.
func (c *Client) ReleaseLease(ctx context.Context, l Lease) error {
	n, err := releaseLeaseScript.Run(ctx, c.rdb, []string{l.Key}, l.Value()).Int()
	if err != nil {
		return wrap(err, "releasing lease", l.Key)
	}
	if n != 1 {
		return fmt.Errorf("redis: releasing lease %s as %s: %w", l.Key, l.Value(), ErrLeaseLost)
	}
	return nil
}

// LeaseHolder returns who holds the lease at key and its remaining time to live; ok is false
// when nobody holds it.
func (c *Client) LeaseHolder(ctx context.Context, key string) (l Lease, ttl time.Duration, ok bool, err error) {
	h := c.LeaseHolders(ctx, []string{key})[0]
	return h.Lease, h.TTL, h.Held, h.Err
}

// LeaseHolding is what LeaseHolders found at one key: as LeaseHolder's results.
type LeaseHolding struct {
	Lease Lease
	TTL   time.Duration
	Held  bool
	Err   error
}

// LeaseHolders is LeaseHolder for several keys in one pipeline, with a result per key in the order
// of keys: flowrun inspect reads every lease of a pipeline at one moment, and a pipeline of many
// partitions in one round trip.
func (c *Client) LeaseHolders(ctx context.Context, keys []string) []LeaseHolding {
	pipe := c.rdb.Pipeline()
	gets := make([]*goredis.StringCmd, len(keys))
	pttls := make([]*goredis.DurationCmd, len(keys))
	for i, key := range keys {
		gets[i], pttls[i] = pipe.Get(ctx, key), pipe.PTTL(ctx, key)
	}
	_, _ = pipe.Exec(ctx)
	out := make([]LeaseHolding, len(keys))
	for i, key := range keys {
		v, err := gets[i].Result()
		switch {
		case isNil(err):
			continue
		case err != nil:
			out[i].Err = wrap(err, "reading lease", key)
			continue
		}
		l, err := parseLeaseValue(key, v)
		if err != nil {
			out[i].Err = err
			continue
		}
		ttl, err := pttls[i].Result()
		if err != nil {
			out[i].Err = wrap(err, "reading lease ttl", key)
			continue
		}
		out[i] = LeaseHolding{Lease: l, TTL: ttl, Held: true}
	}
	return out
}
