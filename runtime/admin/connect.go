package admin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// Conn is an open connection to Redis: a single server or a Redis Cluster.
type Conn struct {
	client *redis.Client
}

// ConnectOptions say which Redis to open and how.
type ConnectOptions struct {
	// URLs are redis://, rediss:// or unix:// URLs (ParseURLs reads them as a user gives them): one
	// server, or the seeds of a Redis Cluster.
	URLs []string
	// TLS configures rediss:// connections; nil uses the system's CAs and no client certificate.
	TLS *tls.Config
}

// Connect opens Redis and checks that it answers. Its error names the address with the password
// redacted; ConnectFailure and IsURLError tell what went wrong.
func Connect(ctx context.Context, opts ConnectOptions) (*Conn, error) {
	c, err := redis.Open(ctx, redis.Options{URLs: opts.URLs, TLSConfig: opts.TLS})
	if err != nil {
		return nil, err
	}
	return &Conn{client: c}, nil
}

// Client is the connection's client, for runtime.Options.Redis, runtime.NewPublisher and the
// functions of this package.
func (c *Conn) Client() *redis.Client { return c.client }

// String describes the connection, with the password redacted.
func (c *Conn) String() string { return c.client.String() }

// Close closes the connection; a read blocked on it ends.
func (c *Conn) Close() error { return c.client.Close() }

// ParseURLs reads Redis URLs as a user gives them: each entry one URL or several separated by
// commas, trimmed, host:port alone meaning redis://host:port; empty entries are dropped.
func ParseURLs(entries ...string) []string { return redis.ParseURLs(entries...) }

// ValidateURLs checks URLs before anything is dialled; its error never shows a password.
func ValidateURLs(urls []string) error { return redis.ValidateURLs(urls) }

// RedactURL returns a URL with its password masked.
func RedactURL(raw string) string { return redis.RedactURL(raw) }

// LoadCertPool reads the CA certificates of a PEM file.
func LoadCertPool(path string) (*x509.CertPool, error) { return redis.LoadCertPool(path) }

// LoadClientCertificate reads a client certificate and its private key, both PEM files.
func LoadClientCertificate(certPath, keyPath string) (tls.Certificate, error) {
	return redis.LoadClientCertificate(certPath, keyPath)
}

// IsURLError reports whether Connect failed because of its URLs, for example a single URL whose
// server turned out to be a node of a Redis Cluster.
func IsURLError(err error) bool {
	var uerr *redis.URLError
	return errors.As(err, &uerr)
}

// ConnectProblem is what a failed connection ran into.
type ConnectProblem int

// The problems of a failed connection. Only ConnectUnreachable may heal by itself.
const (
	// ConnectUnreachable is anything else: connection refused, a timeout, a name that does not
	// resolve, a server that is loading.
	ConnectUnreachable = ConnectProblem(redis.ConnectUnreachable)
	// ConnectWrongPassword: the server refused the user name and password.
	ConnectWrongPassword = ConnectProblem(redis.ConnectWrongPassword)
	// ConnectNeedsPassword: the server requires a password and none was given.
	ConnectNeedsPassword = ConnectProblem(redis.ConnectNeedsPassword)
	// ConnectNoPermission: the user may not run what connecting sends (PING, CLIENT SETNAME).
	ConnectNoPermission = ConnectProblem(redis.ConnectNoPermission)
	// ConnectUntrustedCertificate: the server's certificate is not signed by a trusted CA.
	ConnectUntrustedCertificate = ConnectProblem(redis.ConnectUntrustedCertificate)
	// ConnectWrongHost: the server's certificate is not valid for the host connected to.
	ConnectWrongHost = ConnectProblem(redis.ConnectWrongHost)
	// ConnectBadCertificate: the server's certificate is expired, not yet valid or not meant for
	// a server.
	ConnectBadCertificate = ConnectProblem(redis.ConnectBadCertificate)
	// ConnectClientCertificate: the server requires a client certificate, or refused the one given.
	ConnectClientCertificate = ConnectProblem(redis.ConnectClientCertificate)
	// ConnectNotTLS: a rediss:// URL, and what answered is not a TLS handshake.
	ConnectNotTLS = ConnectProblem(redis.ConnectNotTLS)
	// ConnectTLSOnly: a redis:// URL, and the server hung up at once: probably a TLS port.
	ConnectTLSOnly = ConnectProblem(redis.ConnectTLSOnly)
)

// ConnectFailure classifies an error of Connect: what the connection ran into and the ACL user it
// logged in as. ok is false when err is not a failed connection (invalid URLs, for example).
func ConnectFailure(err error) (problem ConnectProblem, user string, ok bool) {
	var cerr *redis.ConnectError
	if !errors.As(err, &cerr) {
		return ConnectUnreachable, "", false
	}
	return ConnectProblem(cerr.Problem()), cerr.User, true
}
