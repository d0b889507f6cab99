package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A process takes the leases of all its partitions as it starts, and gives them all up as it
// stops: one round trip for all of them, not one each. Inside a pipeline a script is sent whole
// (EVAL): EVALSHA's fallback on NOSCRIPT needs the reply before the next command.

// LeaseResult is the outcome of one key of AcquireLeases: as AcquireLease's results, and the
// time the lease has left (the holder's, when it was not taken).
type LeaseResult struct {
	Lease Lease
	Taken bool
	TTL   time.Duration
	Err   error
}

// AcquireLeases is AcquireLease for several keys in one pipeline, with a result per key in the
// order of keys.
func (c *Client) AcquireLeases(ctx context.Context, keys []string, owner string, ttl time.Duration) ([]LeaseResult, error) {
	if owner == "" {
		return nil, errors.New("redis: acquiring leases: empty owner")
	}
	ms, err := leaseTTL(ttl)
	if err != nil {
		return nil, err
	}
	cmds := make([]*goredis.Cmd, len(keys))
	pipe := c.rdb.Pipeline()
	for i, key := range keys {
		cmds[i] = acquireLeaseScript.Eval(ctx, pipe, []string{key, LeaseFence(key)}, owner, ms)
	}
	_, _ = pipe.Exec(ctx)
	results := make([]LeaseResult, len(keys))
	for i, key := range keys {
		res, err := cmds[i].Slice()
		if err != nil {
			results[i].Err = wrap(err, "acquiring lease", key)
			continue
		}
		if len(res) != 3 {
			results[i].Err = fmt.Errorf("redis: acquiring lease %s: unexpected reply %v", key, res)
			continue
		}
		l, err := parseLeaseValue(key, toString(res[1]))
		if err != nil {
			results[i].Err = err
			continue
		}
		taken, _ := res[0].(int64)
		ttl, _ := res[2].(int64)
		results[i] = LeaseResult{Lease: l, Taken: taken == 1, TTL: time.Duration(ttl) * time.Millisecond}
	}
	return results, nil
}

// ReleaseLeases is ReleaseLease for several leases in one pipeline: an error per lease, nil
// for those released.
func (c *Client) ReleaseLeases(ctx context.Context, leases []Lease) []error {
	cmds := make([]*goredis.Cmd, len(leases))
	pipe := c.rdb.Pipeline()
	for i, l := range leases {
		cmds[i] = releaseLeaseScript.Eval(ctx, pipe, []string{l.Key}, l.Value())
	}
	_, _ = pipe.Exec(ctx)
	errs := make([]error, len(leases))
	for i, l := range leases {
		n, err := cmds[i].Int()
		switch {
		case err != nil:
			errs[i] = wrap(err, "releasing lease", l.Key)
		case n != 1:
			errs[i] = fmt.Errorf("redis: releasing lease %s as %s: %w", l.Key, l.Value(), ErrLeaseLost)
		}
	}
	return errs
}

// RenewLeases is RenewLease of several leases in one pipeline: one round trip however many
// partitions a process holds, so that a process whose Redis is slow to answer does not let the
// last of its leases expire while it renews the first. The error of each lease is at its index.
func (c *Client) RenewLeases(ctx context.Context, leases []Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	ms, err := leaseTTL(ttl)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	cmds := make([]*goredis.Cmd, len(leases))
	pipe := c.rdb.Pipeline()
	for i, l := range leases {
		cmds[i] = renewLeaseScript.Eval(ctx, pipe, []string{l.Key}, l.Value(), ms)
	}
	_, _ = pipe.Exec(ctx)
	for i, l := range leases {
		n, err := cmds[i].Int()
		switch {
		case err != nil:
			errs[i] = wrap(err, "renewing lease", l.Key)
		case n != 1:
			errs[i] = fmt.Errorf("redis: renewing lease %s as %s: %w", l.Key, l.Value(), ErrLeaseLost)
		}
	}
	return errs
}

// GroupRef names a consumer group of a stream.
type GroupRef struct{ Stream, Group string }

// DeleteIdleConsumers is DeleteIdleConsumer of one consumer in several groups, in one pipeline.
// It returns the first error; a consumer that still has pending entries stays, as there.
func (c *Client) DeleteIdleConsumers(ctx context.Context, groups []GroupRef, consumer string) error {
	cmds := make([]*goredis.Cmd, len(groups))
	pipe := c.rdb.Pipeline()
	for i, g := range groups {
		cmds[i] = deleteIdleConsumerScript.Eval(ctx, pipe, []string{g.Stream}, g.Group, consumer)
	}
	_, _ = pipe.Exec(ctx)
	for i, g := range groups {
		if err := cmds[i].Err(); err != nil {
			return wrap(classify(err), "deleting consumer "+consumer+" of group "+g.Group+" on", g.Stream)
		}
	}
	return nil
}
