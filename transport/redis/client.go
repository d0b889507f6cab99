package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
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
	user    string // the ACL user the connections log in as
	// maxEntrySize bounds the entries that reads decode (0: no bound); see WithMaxEntrySize.
	maxEntrySize int64
	// offloadOver is the payload size above which writes offload payloads (0: never); see
	// WithOffloadOver.
	offloadOver int64
	// miniredis: the server is miniredis (the embedded Redis), where writes never offload (see
	// WithOffloadOver).
	miniredis bool
	clock     Clock         // see WithClock; nil: the wall clock
	clocked   *clockedReads // see WithClockedReads; nil: reads block in Redis
	conns     *connIDs      // the IDs of the connections, for UnblockReads; nil on a cluster
	// readTimeout is go-redis's ReadTimeout of the connections (-1: none), and readHints what the
	// raw reads learnt of the replies (rawread.go); nil for a Client not made by Open.
	readTimeout time.Duration
	readHints   *readHints
	// watched are the streams that commits fenced by WATCH leave alone for a while (watched.go);
	// nil on a cluster, where commits are not fenced so.
	watched *watchedStreams
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
// never the password: a *URLError for a URL that cannot be used (found before anything is
// dialled), else a *ConnectError.
func Open(ctx context.Context, opts Options) (*Client, error) {
	urls := ParseURLs(opts.URLs...)
	if len(urls) == 0 {
		return nil, &URLError{Reason: "no URL given"}
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

// userOf returns the ACL user that a connection with these credentials logs in as: a password
// alone authenticates the default user.
func userOf(username string) string {
	if username == "" {
		return "default"
	}
	return username
}

// User returns the name of the ACL user the client logs in as ("default" when the URL names
// none), for messages about its permissions.
func (c *Client) User() string { return c.user }

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
	o.TLSConfig = mergeTLS(o.TLSConfig, opts.TLSConfig)
}

// mergeTLS returns the TLS configuration of a connection: nil for a redis:// URL (fromURL nil),
// else given, with the server name and minimum version of the rediss:// URL where given leaves
// them unset, so that a configuration made only to trust a CA still checks the host name and
// refuses old protocol versions.
func mergeTLS(fromURL, given *tls.Config) *tls.Config {
	if fromURL == nil || given == nil {
		return fromURL
	}
	c := given.Clone()
	if c.ServerName == "" {
		c.ServerName = fromURL.ServerName
	}
	if c.MinVersion == 0 {
		c.MinVersion = fromURL.MinVersion
	}
	return c
}

func openSingle(ctx context.Context, opts Options, o *goredis.Options, desc string) (*Client, error) {
	singleOptions(opts, o)
	conns := newConnIDs(o.PoolSize)
	o.OnConnect = conns.onConnect(o.OnConnect)
	rdb := goredis.NewClient(o)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, &ConnectError{Addr: desc, User: userOf(o.Username), TLS: o.TLSConfig != nil, Err: err}
	}
	c := &Client{rdb: rdb, desc: desc, user: userOf(o.Username), conns: conns,
		readTimeout: o.ReadTimeout, readHints: &readHints{}, watched: newWatchedStreams(rdb)}
	// INFO cluster: an error (for example from miniredis, which lacks the section, or an ACL
	// user without INFO) means we cannot tell, and a plain client is the right guess.
	info, err := rdb.Info(ctx, "cluster").Result()
	if err == nil && strings.Contains(info, "cluster_enabled:1") {
		c.cluster, c.watched = true, nil
	}
	// miniredis answers INFO with two sections of its own and refuses the others so.
	c.miniredis = err != nil && strings.Contains(err.Error(), "section (cluster) is not supported")
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
		return nil, &ConnectError{Addr: desc, User: userOf(co.Username), TLS: co.TLSConfig != nil, Err: err}
	}
	return &Client{rdb: rdb, cluster: true, desc: desc, user: userOf(co.Username),
		readTimeout: co.ReadTimeout, readHints: &readHints{}}, nil
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
			return nil, &URLError{URL: redacted[i], Reason: "only redis:// and rediss:// URLs can be cluster seeds"}
		}
		if o.DB != 0 {
			return nil, &URLError{URL: redacted[i], Reason: fmt.Sprintf("a cluster seed selects db %d; a Redis Cluster has only db 0", o.DB)}
		}
		if (o.TLSConfig != nil) != (first.TLSConfig != nil) {
			return nil, &URLError{Reason: fmt.Sprintf("cluster seeds mix redis:// and rediss:// (%s, %s)", redacted[0], redacted[i])}
		}
		if o.Username != "" || o.Password != "" {
			if o.Username != co.Username || o.Password != co.Password {
				if co.Username == "" && co.Password == "" {
					co.Username, co.Password = o.Username, o.Password
				} else {
					return nil, &URLError{Reason: fmt.Sprintf("cluster seeds %s and %s have different credentials", redacted[0], redacted[i])}
				}
			}
		}
		co.Addrs = append(co.Addrs, o.Addr)
	}
	if co.TLSConfig != nil && opts.TLSConfig != nil {
		// Not the first seed's name: without a ServerName, each node's certificate is checked
		// against the address that node is dialled at.
		serverName := opts.TLSConfig.ServerName
		co.TLSConfig = mergeTLS(co.TLSConfig, opts.TLSConfig)
		co.TLSConfig.ServerName = serverName
	}
	return co, nil
}

// ConnectError is an Open whose server could not be reached or refused the connection. It names
// the address with the password redacted; Problem tells the failures that waiting will not heal
// from those that may.
type ConnectError struct {
	// Addr is the server, or "redis cluster " and the seeds, with passwords redacted.
	Addr string
	// User is the ACL user the connection logs in as.
	User string
	// TLS is set for rediss:// URLs.
	TLS bool
	Err error
}

func (e *ConnectError) Error() string { return "redis: connecting to " + e.Addr + ": " + e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// ConnectProblem is what a failed connection ran into.
type ConnectProblem int

// The problems of a ConnectError. Only ConnectUnreachable may heal by itself.
const (
	// ConnectUnreachable is anything else: connection refused, a timeout, a name that does not
	// resolve, a server that is loading.
	ConnectUnreachable ConnectProblem = iota
	// ConnectWrongPassword: the server refused the user name and password (WRONGPASS).
	ConnectWrongPassword
	// ConnectNeedsPassword: the server requires a password and none was given (NOAUTH).
	ConnectNeedsPassword
	// ConnectNoPermission: the user may not run what connecting sends (PING, CLIENT SETNAME).
	ConnectNoPermission
	// ConnectUntrustedCertificate: the server's certificate is not signed by a CA the client
	// trusts.
	ConnectUntrustedCertificate
	// ConnectWrongHost: the server's certificate is not valid for the host connected to.
	ConnectWrongHost
	// ConnectBadCertificate: the server's certificate is expired, not yet valid or not meant
	// for a server.
	ConnectBadCertificate
	// ConnectClientCertificate: the server requires a client certificate, or refused the one
	// given: it said so, or (TLS 1.3, where the client's certificate is checked after the client
	// thinks the handshake done) it closed the TLS connection at the first command.
	ConnectClientCertificate
	// ConnectNotTLS: a rediss:// URL, and what answered (or did not answer within the dial
	// timeout) is not a TLS handshake: probably a plain port.
	ConnectNotTLS
	// ConnectTLSOnly: a redis:// URL, and the server hung up at once: probably a TLS port.
	ConnectTLSOnly
)

// Problem classifies the failure.
func (e *ConnectError) Problem() ConnectProblem {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		op        *net.OpError
	)
	msg := e.Err.Error()
	switch {
	case strings.Contains(msg, "WRONGPASS"):
		return ConnectWrongPassword
	case strings.Contains(msg, "NOAUTH"):
		return ConnectNeedsPassword
	case strings.Contains(msg, "NOPERM"):
		return ConnectNoPermission
	case errors.As(e.Err, &unknownCA):
		return ConnectUntrustedCertificate
	case errors.As(e.Err, &hostname):
		return ConnectWrongHost
	case errors.As(e.Err, &invalid):
		return ConnectBadCertificate
	case errors.As(e.Err, &op) && op.Op == "remote error" && op.Err != nil && isClientCertAlert(op.Err.Error()),
		e.TLS && hungUp(e.Err):
		return ConnectClientCertificate
	case e.TLS && (errors.As(e.Err, &record) || errors.Is(e.Err, context.DeadlineExceeded) || isTimeout(e.Err)):
		return ConnectNotTLS
	case !e.TLS && hungUp(e.Err):
		return ConnectTLSOnly
	}
	return ConnectUnreachable
}

// hungUp reports whether the server closed a connection it had accepted.
func hungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// isClientCertAlert reports whether a TLS alert from the server is about the client's
// certificate: missing (certificate required; handshake failure in TLS 1.2, where the server
// has no other reason to give) or not accepted.
func isClientCertAlert(alert string) bool {
	for _, a := range []string{"certificate required", "bad certificate", "unknown certificate authority",
		"certificate expired", "certificate revoked", "unsupported certificate", "certificate unknown", "handshake failure"} {
		if strings.Contains(alert, a) {
			return true
		}
	}
	return false
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// LoadCertPool reads a PEM bundle of CA certificates, to trust in Options.TLSConfig.RootCAs.
func LoadCertPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate (a \"-----BEGIN CERTIFICATE-----\" block)", path)
	}
	return pool, nil
}

// LoadClientCertificate reads a client certificate (PEM, possibly followed by its chain) and its
// private key (PEM), for Options.TLSConfig.Certificates.
func LoadClientCertificate(certPath, keyPath string) (tls.Certificate, error) {
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Stat(p); err != nil {
			return tls.Certificate{}, err
		}
	}
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s and %s: %w", certPath, keyPath, err)
	}
	return c, nil
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
