package redis

import (
	"context"
	"sort"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// KeysUnder returns every key whose name starts with prefix followed by ':', sorted. On a Redis
// Cluster it scans every master, since a pipeline's keys live in many slots. It uses SCAN, which
// does not block the server as KEYS would; a key written while it scans may or may not be listed.
func (c *Client) KeysUnder(ctx context.Context, prefix string) ([]string, error) {
	pattern := globEscape(prefix) + ":*"
	var mu sync.Mutex
	seen := map[string]bool{}
	scan := func(ctx context.Context, node goredis.UniversalClient) error {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, k := range keys {
				seen[k] = true
			}
			mu.Unlock()
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	if cc, ok := c.rdb.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error { return scan(ctx, node) })
	} else {
		err = scan(ctx, c.rdb)
	}
	if err != nil {
		return nil, wrap(err, "scanning the keys under", prefix+":")
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

// DeleteKeys deletes keys one DEL each (they may live in different slots of a cluster) and
// returns how many existed.
func (c *Client) DeleteKeys(ctx context.Context, keys ...string) (int64, error) {
	var n int64
	for _, k := range keys {
		d, err := c.rdb.Del(ctx, k).Result()
		if err != nil {
			return n, wrap(err, "deleting", k)
		}
		n += d
	}
	return n, nil
}

// DestroyGroup removes a consumer group from a stream (XGROUP DESTROY), with its pending entries
// and consumers; the stream's entries stay. It reports whether the group existed.
func (c *Client) DestroyGroup(ctx context.Context, stream, group string) (bool, error) {
	n, err := c.rdb.XGroupDestroy(ctx, stream, group).Result()
	if err != nil {
		return false, wrap(err, "destroying the group "+group+" of", stream)
	}
	return n > 0, nil
}

// RecreateGroupAtEnd replaces a consumer group by an empty one whose reading starts after the
// stream's last entry: its pending entries and consumers go, the entries stay, and its readers
// read only what is written next. Both commands go in one transaction (one key, one slot).
func (c *Client) RecreateGroupAtEnd(ctx context.Context, stream, group string) error {
	_, err := c.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.XGroupDestroy(ctx, stream, group)
		p.XGroupCreate(ctx, stream, group, "$")
		return nil
	})
	return wrap(err, "moving the group "+group+" to the end of", stream)
}
