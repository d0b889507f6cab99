package cmd

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/internal/embedded"
	"github.com/flowrun/flowrun/runtime/admin"
)

// EnvRedisURL is the environment variable that locates Redis when --redis is not given. It takes
// the same syntax as the flag: one URL, or several comma-separated cluster seeds.
const EnvRedisURL = "FLOWRUN_REDIS_URL"

// The environment variables of the TLS files, for --redis-ca, --redis-cert and --redis-key.
const (
	EnvRedisCA   = "FLOWRUN_REDIS_CA"
	EnvRedisCert = "FLOWRUN_REDIS_CERT"
	EnvRedisKey  = "FLOWRUN_REDIS_KEY"
)

// redisFlags are the connection flags of every command that talks to Redis.
type redisFlags struct {
	urls          []string
	ca, cert, key string
}

func (f *redisFlags) register(c *cobra.Command) {
	c.Flags().StringArrayVar(&f.urls, "redis", nil,
		"Redis to use, as redis://[user:password@]host:port[/db], rediss://... for TLS or unix:///path/to/socket; "+
			"host:port alone means redis://host:port; repeat it or separate URLs with commas to give the seeds of a "+
			"Redis Cluster (default $"+EnvRedisURL+")")
	c.Flags().StringVar(&f.ca, "redis-ca", "", "trust the CA certificates of this PEM file (instead of the system's) "+
		"for rediss:// connections (default $"+EnvRedisCA+")")
	c.Flags().StringVar(&f.cert, "redis-cert", "", "present the client certificate of this PEM file on rediss:// "+
		"connections; needs --redis-key (default $"+EnvRedisCert+")")
	c.Flags().StringVar(&f.key, "redis-key", "", "the private key (PEM) of --redis-cert (default $"+EnvRedisKey+")")
}

// configured returns the URLs from --redis, or else from FLOWRUN_REDIS_URL, split and trimmed,
// and where they came from, for messages; none when neither says anything.
func (f *redisFlags) configured() ([]string, string) {
	if urls := admin.ParseURLs(f.urls...); len(urls) > 0 {
		return urls, "--redis"
	}
	return admin.ParseURLs(os.Getenv(EnvRedisURL)), EnvRedisURL
}

// setting is a TLS file: its flag's value, or else its environment variable's; name is where it
// came from, for messages.
type setting struct{ flag, name, value string }

func fileSetting(flag, value, env string) setting {
	if value != "" {
		return setting{flag, flag, value}
	}
	if v := os.Getenv(env); v != "" {
		return setting{flag, env, v}
	}
	return setting{flag, flag, ""}
}

// tlsSettings returns the TLS files given, by flag or in the environment.
func (f *redisFlags) tlsSettings() []setting {
	var given []setting
	for _, s := range []setting{
		fileSetting("--redis-ca", f.ca, EnvRedisCA),
		fileSetting("--redis-cert", f.cert, EnvRedisCert),
		fileSetting("--redis-key", f.key, EnvRedisKey),
	} {
		if s.value != "" {
			given = append(given, s)
		}
	}
	return given
}

// tlsConfig builds the TLS configuration of the given TLS files; nil when there are none. Its
// errors are exitErrors for invalid options, naming the flag.
func tlsConfig(given []setting) (*tls.Config, error) {
	if len(given) == 0 {
		return nil, nil
	}
	var ca, cert, key setting
	for _, s := range given {
		switch s.flag {
		case "--redis-ca":
			ca = s
		case "--redis-cert":
			cert = s
		case "--redis-key":
			key = s
		}
	}
	invalid := func(format string, args ...any) error {
		return exitError{code: ExitInvalid, message: oneLine(fmt.Sprintf(format, args...))}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca.value != "" {
		pool, err := admin.LoadCertPool(ca.value)
		if err != nil {
			return nil, invalid("%s: %v", ca.name, err)
		}
		cfg.RootCAs = pool
	}
	switch {
	case cert.value != "" && key.value == "":
		return nil, invalid("%s needs --redis-key: the private key of the client certificate", cert.name)
	case cert.value == "" && key.value != "":
		return nil, invalid("%s needs --redis-cert: the client certificate of the key", key.name)
	case cert.value != "":
		c, err := admin.LoadClientCertificate(cert.value, key.value)
		if err != nil {
			return nil, invalid("%s and %s: %v", cert.name, key.name, err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

// connect opens the configured Redis (--redis, else FLOWRUN_REDIS_URL) and returns the client and
// a function that closes it. With none configured and allowEmbedded, it starts the embedded
// in-memory Redis and says so on stderr, since its data does not survive the process; without
// allowEmbedded it fails with a message saying how to configure one. Its errors are exitErrors of
// one line that name the address but never the password: exit code 2 for URLs and TLS files that
// cannot be used, found before anything is dialled, 1 for a Redis that cannot be reached or
// refuses the connection, with a hint where the cause is clear.
//
// TLS files given as flags to a connection without TLS are a mistake (the user expects TLS);
// given in the environment they are ignored there, so that a shell set up for a TLS server can
// still reach a local plain one.
func (f *redisFlags) connect(ctx context.Context, stderr io.Writer, allowEmbedded bool) (*admin.Conn, func(), error) {
	urls, from := f.configured()
	if len(urls) > 0 {
		if err := admin.ValidateURLs(urls); err != nil {
			return nil, nil, exitError{code: ExitInvalid, message: from + ": " + strings.TrimPrefix(connectionError(err, urls), "redis: ")}
		}
	}
	tlsGiven := f.tlsSettings()
	if len(urls) == 0 || !strings.HasPrefix(strings.ToLower(urls[0]), "rediss://") {
		for _, s := range tlsGiven {
			if s.name == s.flag {
				msg := s.flag + " is for TLS connections: give a rediss:// URL with --redis or in " + EnvRedisURL
				if len(urls) > 0 {
					msg = s.flag + " is for TLS connections, and " + from + " gives " + admin.RedactURL(urls[0]) + ": use a rediss:// URL"
				}
				return nil, nil, exitError{code: ExitInvalid, message: msg}
			}
		}
		tlsGiven = nil
	}
	tlsCfg, err := tlsConfig(tlsGiven)
	if err != nil {
		return nil, nil, err
	}
	if len(urls) > 0 {
		c, err := admin.Connect(ctx, admin.ConnectOptions{URLs: urls, TLS: tlsCfg})
		if err != nil {
			if admin.IsURLError(err) { // a single URL whose server turned out to be a cluster node
				return nil, nil, exitError{code: ExitInvalid, message: from + ": " + strings.TrimPrefix(connectionError(err, urls), "redis: ")}
			}
			msg := connectionError(err, urls)
			if hint := connectHint(err, from, tlsGiven); hint != "" {
				msg = strings.TrimSuffix(msg, ".") + "; " + hint
			}
			return nil, nil, exitError{code: ExitError, message: msg}
		}
		return c, func() { _ = c.Close() }, nil
	}
	if !allowEmbedded {
		return nil, nil, exitError{code: ExitError, message: "no Redis configured: give its URL with --redis " +
			"redis://host:6379 or in the " + EnvRedisURL + " environment variable"}
	}
	srv, err := embedded.Start()
	if err != nil {
		return nil, nil, exitError{code: ExitError, message: err.Error()}
	}
	c, err := admin.Connect(ctx, admin.ConnectOptions{URLs: []string{srv.URL()}})
	if err != nil {
		srv.Close()
		return nil, nil, exitError{code: ExitError, message: "the embedded Redis: " + oneLine(err.Error())}
	}
	note(stderr, "flowrun: no Redis configured (--redis or %s): using an embedded in-memory Redis at %s; "+
		"its data is lost when flowrun exits\n", EnvRedisURL, srv.Addr())
	return c, func() { _ = c.Close(); srv.Close() }, nil
}

// connectHint says what to do about a connection that failed for a reason waiting will not fix,
// or may be a mix-up of TLS and plain ports; "" for the others (Redis down, a wrong address).
func connectHint(err error, from string, tlsGiven []setting) string {
	problem, user, ok := admin.ConnectFailure(err)
	if !ok {
		return ""
	}
	given := func(flag string) string {
		for _, s := range tlsGiven {
			if s.flag == flag {
				return s.name + " " + s.value
			}
		}
		return ""
	}
	switch problem {
	case admin.ConnectWrongPassword:
		return "the server refused the user name and password of " + from + " (write them as USER:PASSWORD@ " +
			"before the host, with special characters percent-encoded)"
	case admin.ConnectNeedsPassword:
		return "the server requires a password: give it in the URL, redis://USER:PASSWORD@HOST:PORT " +
			"(or redis://:PASSWORD@HOST:PORT for the default user)"
	case admin.ConnectNoPermission:
		return "the user may not run what connecting sends: grant it with ACL SETUSER " + user + " +hello +client|setname +ping +info"
	case admin.ConnectUntrustedCertificate:
		if ca := given("--redis-ca"); ca != "" {
			return "the server's certificate is not signed by a CA of " + ca
		}
		return "the server's certificate is signed by a CA this machine does not trust: give the CA's certificate " +
			"(PEM) with --redis-ca FILE"
	case admin.ConnectWrongHost:
		return "the server's certificate is not valid for the host of the URL: connect by a name or address it lists"
	case admin.ConnectBadCertificate:
		return "the server's certificate is expired, not yet valid or not meant for a server"
	case admin.ConnectClientCertificate:
		if cert := given("--redis-cert"); cert != "" {
			return "the server refused the client certificate of " + cert + ": is it signed by a CA the server trusts " +
				"(its tls-ca-cert-file)?"
		}
		return "the server requires a client certificate: give it with --redis-cert FILE and --redis-key FILE"
	case admin.ConnectNotTLS:
		return "no TLS answer: if the server does not serve TLS on that port, use redis://"
	case admin.ConnectTLSOnly:
		return "the server closed the connection at once: if it serves TLS on that port, use rediss://"
	}
	return ""
}

// connectionError makes the error of a failed Open one line. transport/redis already names the
// address with the password redacted; as a second line of defence, any password of urls that
// still appears is masked.
func connectionError(err error, urls []string) string {
	msg := oneLine(err.Error())
	for _, u := range urls {
		pw := password(u)
		decoded, err := url.PathUnescape(pw)
		if err != nil {
			decoded = pw
		}
		for _, s := range []string{pw, decoded} {
			if len(s) >= 4 { // shorter ones would mask ordinary words
				msg = strings.ReplaceAll(msg, s, "xxxxx")
			}
		}
	}
	return msg
}

// password returns the password of a redis URL, or "".
func password(raw string) string {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return ""
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// oneLine joins the lines of a message.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
