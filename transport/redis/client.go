package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Defaults of Options.
const (
	// DefaultPoolSize is the default number of connections per Redis node. A blocking
	// XREADGROUP holds a connection for up to its Block duration, so the pool must be larger
	// than the number of readers that block at the same time, plus what the producers, commits
	// and timers use concurrently. 128 covers a process running dozens of partition workers.
	DefaultPoolSize = 128
	// DefaultDialTimeout bounds establishing a connection.
	DefaultDialTimeout = 5 * time.Second
	// DefaultReadTimeout bounds waiting for a reply to a non-blocking command. Blocking reads
	// get their Block duration on top.
	DefaultReadTimeout = 5 * time.Second
	// DefaultWriteTimeout bounds writing a command.
	DefaultWriteTimeout = 5 * time.Second
	// DefaultClientName is the CLIENT SETNAME of every connection, so that CLIENT LIST shows
	// flowrun's connections.
	DefaultClientName = "flowrun"
	// DefaultDialAttempts is how many times a new connection is dialled before the error goes to
	// the caller: once. go-redis's own default is 5 attempts 100 ms apart, which makes every call
	// to a Redis that is down take 0.4 s or more (a cluster client tries every seed in turn, so
	// about a second for three) before it fails, and with it `flowrun inspect` against
	// a wrong address. A caller that wants to wait for Redis retries on its own terms: the
	// runtime backs off and tries again, the command-line tools report the error at once.
	DefaultDialAttempts = 1
)

// Options configure Open. The zero value of every field but URLs means its default.
type Options struct {
	// URLs locate Redis. One URL is a single server, for example
	// "redis://localhost:6379/0", "rediss://user:secret@redis.example:6380/2" (TLS, ACL user).
	// Several URLs are seeds of one Redis Cluster (db must be 0; the scheme and credentials
	// must agree). A single URL whose server is a cluster node (INFO cluster says
	// cluster_enabled:1) is opened as a cluster too. Entries may themselves be comma-separated
	// lists; see ParseURLs. Query parameters of go-redis URLs (for example skip_verify=true,
	// dial_timeout=3s) are honoured for a single server where the field of Options is zero.
	URLs []string
	// PoolSize is the maximum number of connections per node. Default DefaultPoolSize. See
	// DefaultPoolSize for why blocking readers need a generous pool.
	PoolSize int
	// DialTimeout, ReadTimeout and WriteTimeout default to DefaultDialTimeout,
	// DefaultReadTimeout and DefaultWriteTimeout.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// TLSConfig replaces the TLS configuration that a rediss:// URL implies (for example to
	// trust a private CA or to present a client certificate). It is ignored for redis:// URLs.
	TLSConfig *tls.Config
	// ClientName is sent with CLIENT SETNAME. Default DefaultClientName.
	ClientName string
	// MaxRetries is how many times the go-redis client retries a command after a network
	// error. Default 0: no retries, errors go to the caller, which owns the retry policy.
	// Retrying an XADD whose reply was lost can write it twice.
	//
	// On a Redis Cluster, go-redis also retries a command after a network error within its
	// budget for MOVED and ASK redirections (3, with a backoff of 10 ms to 1 s), first on the
	// same node, then on another; that budget is what lets a client follow a resharding or a
	// failover, so it is left alone, and it does not depend on MaxRetries.
	MaxRetries int
	// DialAttempts is how many times a new connection is dialled before the call that needed it
	// fails (go-redis's DialerRetries, which counts attempts, not retries; attempts are 100 ms
	// apart). Default DefaultDialAttempts, 1: a Redis that is down or a wrong address is
	// reported at once. Each attempt may take up to DialTimeout when the address does not answer
	// at all (a firewall that drops packets, a host that is gone).
	DialAttempts int
}

// Client is a connection pool to a Redis server or Redis Cluster, with flowrun's operations.
// It is safe for concurrent use.
type Client struct {
	rdb     goredis.UniversalClient
	cluster bool
	desc    string // redacted, for errors and String
	// maxEntrySize bounds the entries that reads decode (0: no bound); see WithMaxEntrySize.
	maxEntrySize int64
}

// WithMaxEntrySize returns a client on the same connections whose group reads (ReadGroup,
// ReadPending, Reclaim) and ClaimRetries report every entry larger than n bytes (see EntrySize)
// as malformed, without decoding it: its dead letter says how large it was. n <= 0 means no
// limit. The size is known from the reply, so the entry is in memory already; the limit keeps it
// from being decoded, processed and copied downstream, hop after hop.
func (c *Client) WithMaxEntrySize(n int64) *Client {
	limited := *c
	limited.maxEntrySize = max(n, 0)
	return &limited
}

// Open connects to Redis and checks the connection with PING. The error names the address but
// never the password.
func Open(ctx context.Context, opts Options) (*Client, error) {
	urls := ParseURLs(opts.URLs...)
	if len(urls) == 0 {
		return nil, errors.New("redis: no URL given")
	}
	parsed := make([]*goredis.Options, len(urls))
	for i, u := range urls {
		o, err := parseURL(u)
		if err != nil {
			return nil, err
		}
		parsed[i] = o
	}
	redacted := make([]string, len(urls))
	for i, u := range urls {
		redacted[i] = RedactURL(u)
	}
	if len(urls) == 1 {
		c, err := openSingle(ctx, opts, parsed[0], redacted[0])
		if err != nil || !c.cluster {
			return c, err
		}
		// A cluster node given as a single URL: reopen as a cluster client seeded with it.
		_ = c.rdb.Close()
	}
	return openCluster(ctx, opts, parsed, redacted)
}

func applyDefaults(opts *Options) {
	if opts.PoolSize <= 0 {
		opts.PoolSize = DefaultPoolSize
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = DefaultReadTimeout
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.ClientName == "" {
		opts.ClientName = DefaultClientName
	}
	if opts.DialAttempts <= 0 {
		opts.DialAttempts = DefaultDialAttempts
	}
}

func maxRetries(n int) int {
	if n <= 0 {
		return -1 // go-redis: -1 disables retries, 0 means its default of 3
	}
	return n
}

// singleOptions sets the go-redis options of a single-server client from opts. A field that opts
// leaves at zero takes the URL's query parameter (pool_size, dial_timeout, read_timeout,
// write_timeout, client_name, max_retries) when it has one, and else the default.
func singleOptions(opts Options, o *goredis.Options) {
	if opts.PoolSize <= 0 {
		opts.PoolSize = o.PoolSize
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = o.DialTimeout
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = o.ReadTimeout
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = o.WriteTimeout
	}
	if opts.ClientName == "" {
		opts.ClientName = o.ClientName
	}
	if opts.MaxRetries <= 0 {
		opts.MaxRetries = o.MaxRetries
	}
	applyDefaults(&opts)
	o.PoolSize = opts.PoolSize
	o.DialTimeout = opts.DialTimeout
	o.DialerRetries = opts.DialAttempts
	o.ReadTimeout = opts.ReadTimeout
	o.WriteTimeout = opts.WriteTimeout
	o.ClientName = opts.ClientName
	o.MaxRetries = maxRetries(opts.MaxRetries)
	o.ContextTimeoutEnabled = true
	o.Protocol = 2 // RESP2: the widest support (miniredis, older servers, proxies)
	if o.TLSConfig != nil && opts.TLSConfig != nil {
		o.TLSConfig = opts.TLSConfig.Clone()
	}
}

func openSingle(ctx context.Context, opts Options, o *goredis.Options, desc string) (*Client, error) {
	singleOptions(opts, o)
	rdb := goredis.NewClient(o)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis: connecting to %s: %w", desc, err)
	}
	c := &Client{rdb: rdb, desc: desc}
	// INFO cluster: an error (for example from miniredis, which lacks the section, or an ACL
	// user without INFO) means we cannot tell, and a plain client is the right guess.
	if info, err := rdb.Info(ctx, "cluster").Result(); err == nil && strings.Contains(info, "cluster_enabled:1") {
		c.cluster = true
	}
	return c, nil
}

func openCluster(ctx context.Context, opts Options, parsed []*goredis.Options, redacted []string) (*Client, error) {
	co, err := clusterOptions(opts, parsed, redacted)
	if err != nil {
		return nil, err
	}
	desc := "redis cluster " + strings.Join(redacted, ",")
	rdb := goredis.NewClusterClient(co)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis: connecting to %s: %w", desc, err)
	}
	return &Client{rdb: rdb, cluster: true, desc: desc}, nil
}

// clusterOptions returns the go-redis options of a cluster client seeded with the parsed URLs.
func clusterOptions(opts Options, parsed []*goredis.Options, redacted []string) (*goredis.ClusterOptions, error) {
	applyDefaults(&opts)
	first := parsed[0]
	co := &goredis.ClusterOptions{
		Username:              first.Username,
		Password:              first.Password,
		TLSConfig:             first.TLSConfig,
		PoolSize:              opts.PoolSize,
		DialTimeout:           opts.DialTimeout,
		DialerRetries:         opts.DialAttempts,
		ReadTimeout:           opts.ReadTimeout,
		WriteTimeout:          opts.WriteTimeout,
		ClientName:            opts.ClientName,
		MaxRetries:            maxRetries(opts.MaxRetries),
		ContextTimeoutEnabled: true,
		Protocol:              2,
	}
	for i, o := range parsed {
		if o.Network != "tcp" {
			return nil, fmt.Errorf("redis: cluster seed %s: only redis:// and rediss:// URLs can be cluster seeds", redacted[i])
		}
		if o.DB != 0 {
			return nil, fmt.Errorf("redis: cluster seed %s selects db %d; a Redis Cluster has only db 0", redacted[i], o.DB)
		}
		if (o.TLSConfig != nil) != (first.TLSConfig != nil) {
			return nil, fmt.Errorf("redis: cluster seeds mix redis:// and rediss:// (%s, %s)", redacted[0], redacted[i])
		}
		if o.Username != "" || o.Password != "" {
			if o.Username != co.Username || o.Password != co.Password {
				if co.Username == "" && co.Password == "" {
					co.Username, co.Password = o.Username, o.Password
				} else {
					return nil, fmt.Errorf("redis: cluster seeds %s and %s have different credentials", redacted[0], redacted[i])
				}
			}
		}
		co.Addrs = append(co.Addrs, o.Addr)
	}
	if co.TLSConfig != nil && opts.TLSConfig != nil {
		co.TLSConfig = opts.TLSConfig.Clone()
	}
	return co, nil
}

// Close closes every connection. Calls in flight fail.
func (c *Client) Close() error { return c.rdb.Close() }

// IsCluster reports whether the client talks to a Redis Cluster.
func (c *Client) IsCluster() bool { return c.cluster }

// Universal returns the underlying go-redis client, for tests (to set up or check what Redis
// holds). Code outside this package uses the Client's methods: this package is the only one that
// speaks Redis commands, and its methods keep the key layout and the fencing rules.
func (c *Client) Universal() goredis.UniversalClient { return c.rdb }

// String describes the connection with the password redacted, for example
// "redis://app:xxxxx@10.0.0.5:6379/0".
func (c *Client) String() string { return c.desc }

// wrap prefixes an error with the operation and key, keeping it inspectable with errors.Is/As.
func wrap(err error, op, key string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("redis: %s %s: %w", op, key, err)
}
