package redis

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// ParseURLs turns entries such as the values of --redis and FLOWRUN_REDIS_URL into single URLs.
// An entry may be a comma-separated list. Since a comma is a legal character of a password in a
// URL (redis://app:p,w@host:6379 is one URL), an entry is split only at a comma that starts
// another URL:
//
//   - a comma followed by a URL with a scheme ("redis://", "rediss://", "unix://", ...) always
//     separates, and
//   - any other comma separates only after the last '@' of the URL being read, that is after its
//     user name and password, where a list of bare seeds ("host:port") may follow.
//
// So "redis://a:1,b:2" and "redis://app:pw@a:1,b:2,c:3" are lists, and "redis://app:p,w@a:1" is one
// URL. A list in which a later seed has its own credentials must give that seed's scheme:
// "redis://a:1,redis://app:pw@b:2". A password that contains ",redis://" (a comma followed by
// anything that looks like a scheme and "://") must percent-encode the comma (%2C).
//
// White space around each URL is trimmed and empty entries are dropped. An entry without a scheme
// ("host:port", "user:password@host:port") is a plain TCP URL: it becomes "redis://host:port", so
// that a list of cluster seeds can be written "a:7000,b:7000,c:7000". ParseURLs does not validate
// the URLs; ValidateURLs and Open do.
func ParseURLs(entries ...string) []string {
	var out []string
	for _, e := range entries {
		for {
			e = strings.TrimLeft(e, ", \t\r\n")
			if e == "" {
				break
			}
			limit := nextSchemeComma(e)
			n := firstURLEnd(e[:limit])
			u := strings.TrimSpace(e[:n])
			if !strings.Contains(u, "://") {
				u = "redis://" + u
			}
			out = append(out, u)
			e = e[n:]
		}
	}
	return out
}

// nextSchemeComma returns the index of the first comma of s that is followed (after white space)
// by "<scheme>://", or len(s).
func nextSchemeComma(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			if _, ok := schemePrefix(strings.TrimLeft(s[i+1:], " \t\r\n")); ok {
				return i
			}
		}
	}
	return len(s)
}

// schemePrefix returns the scheme of s if s starts with "<scheme>://", where a scheme is a letter
// followed by letters, digits, '+', '-' or '.' (RFC 3986).
func schemePrefix(s string) (string, bool) {
	scheme, _, ok := strings.Cut(s, "://")
	if !ok || scheme == "" {
		return "", false
	}
	for i, r := range scheme {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return "", false
		}
	}
	return scheme, true
}

// firstURLEnd returns the length of the first URL of s, which holds no ",<scheme>://": up to the
// first comma after its user information (everything before its last '@'), or all of s.
func firstURLEnd(s string) int {
	start := 0
	if scheme, ok := schemePrefix(strings.TrimLeft(s, " \t\r\n")); ok {
		start = strings.Index(s, scheme+"://") + len(scheme) + len("://")
	}
	if at := strings.LastIndexByte(s[start:], '@'); at >= 0 {
		start += at + 1
	}
	if c := strings.IndexByte(s[start:], ','); c >= 0 {
		return start + c
	}
	return len(s)
}

// redactedPassword replaces a password in RedactURL's output.
const redactedPassword = "xxxxx"

// plainURL parses raw as a URL with an authority ("scheme://...") and reports whether its parts
// are what they seem: an '@' after the authority (in the path, query or fragment) means that a
// password holds a '/', '?' or '#' that should have been percent-encoded, so that what url.Parse
// takes for the host, port or path is part of the password.
func plainURL(raw string) (*url.URL, bool) {
	scheme, ok := schemePrefix(raw)
	if !ok {
		return nil, false
	}
	rest := raw[len(scheme)+len("://"):]
	if i := strings.IndexAny(rest, "/?#"); i >= 0 && strings.IndexByte(rest[i:], '@') >= 0 {
		return nil, false
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return nil, false
	}
	return u, true
}

// RedactURL returns a URL for logs and errors with its password replaced by "xxxxx", for example
// "redis://app:xxxxx@host:6379/0". It prints only what it can identify safely: of a string that
// does not parse as a URL, or whose parts are not what they seem (see below), it prints the scheme
// and, when there is user information to skip (an '@'), the host after it, for example
// "redis://xxxxx@host:6379"; without an '@' it cannot tell a host from a password and prints
// "redis://<redacted>". A string without a scheme and "://" is printed as "<redacted URL>".
//
// A URL whose password has an unencoded '/', '?' or '#' parses, but as a host, port and path made
// of pieces of the password ("redis://app:12/34@host" has host "app", port 12 and path
// "/34@host"); an '@' after the host gives it away, and such a URL is treated as unparseable.
func RedactURL(raw string) string {
	if u, ok := plainURL(raw); ok {
		return u.Redacted()
	}
	scheme, ok := schemePrefix(raw)
	if !ok {
		return "<redacted URL>"
	}
	rest := raw[len(scheme)+len("://"):]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return scheme + "://<redacted>"
	}
	host, path := rest[at+1:], ""
	if i := strings.IndexAny(host, "/?#"); i >= 0 {
		host, path = host[:i], host[i:]
	}
	if !safeHost(host) {
		return scheme + "://" + redactedPassword + "@<redacted>"
	}
	if !isDBPath(path) {
		path = ""
	}
	return scheme + "://" + redactedPassword + "@" + host + path
}

// safeHost reports whether s is made of the characters of a host name, an IP address (with
// brackets and a zone) and a port only.
func safeHost(s string) bool {
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune(".-_:[]%", r):
		default:
			return false
		}
	}
	return true
}

// isDBPath reports whether s is the path of a database number: "/", "/3".
func isDBPath(s string) bool {
	if !strings.HasPrefix(s, "/") {
		return false
	}
	for _, r := range s[1:] {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// errBadURL is the cause of every URL that does not parse: the parser's own messages quote the
// URL, or the piece they stumbled on, which may be part of the password.
var errBadURL = errors.New("not a valid URL (percent-encode special characters of the user name and password: " +
	"'@' as %40, '/' as %2F, '%' as %25, a space as %20)")

// URLError is a Redis URL that cannot be used, found before anything is dialled: an unsupported
// scheme, a port that is not a number, a database that is not one, cluster seeds that disagree. It
// names the URL with its password redacted. It is the user's mistake, not the server's: the
// command line exits with its "invalid options" status for it.
type URLError struct {
	// URL is the URL, redacted (RedactURL); "" when the error is about several URLs at once.
	URL string
	// Reason says what is wrong and, where it can, what to write instead.
	Reason string
}

func (e *URLError) Error() string {
	if e.URL == "" {
		return "redis: " + e.Reason
	}
	return "redis: invalid URL " + e.URL + ": " + e.Reason
}

// Schemes lists the URL schemes Open accepts, for messages.
const Schemes = "redis:// (TCP), rediss:// (TLS) or unix:// (a Unix socket)"

// ValidateURLs checks URLs as ParseURLs returns them, without connecting: every one must be a
// redis://, rediss:// or unix:// URL that go-redis can use, and several URLs must be consistent
// seeds of one Redis Cluster. The error is a *URLError. Open makes the same checks.
func ValidateURLs(urls []string) error {
	if len(urls) == 0 {
		return &URLError{Reason: "no URL given"}
	}
	parsed := make([]*goredis.Options, len(urls))
	redacted := make([]string, len(urls))
	for i, u := range urls {
		o, err := parseURL(u)
		if err != nil {
			return err
		}
		parsed[i], redacted[i] = o, RedactURL(u)
	}
	if len(urls) > 1 {
		if _, err := clusterOptions(Options{}, parsed, redacted); err != nil {
			return err
		}
	}
	return nil
}

// parseURL parses one URL with go-redis's rules, keeping secrets out of the error, which is a
// *URLError.
func parseURL(raw string) (*goredis.Options, error) {
	scheme, ok := schemePrefix(raw)
	if !ok {
		return nil, &URLError{URL: RedactURL(raw), Reason: "no scheme: use " + Schemes}
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss":
		if err := checkHostPort(raw, scheme); err != nil {
			return nil, err
		}
	case "unix":
		path := raw[len(scheme)+len("://"):]
		path = path[strings.LastIndexByte(path, '@')+1:]
		if i := strings.IndexAny(path, "?#"); i >= 0 {
			path = path[:i]
		}
		if strings.TrimSpace(path) == "" {
			return nil, &URLError{URL: scheme + "://", Reason: "no socket path: write unix:///path/to/redis.sock"}
		}
	default:
		// The scheme is printable: it comes before "://", where no password can be.
		return nil, &URLError{URL: RedactURL(raw), Reason: fmt.Sprintf("unsupported scheme %q: use %s", scheme, Schemes)}
	}
	if _, ok := plainURL(raw); !ok {
		return nil, &URLError{URL: RedactURL(raw), Reason: errBadURL.Error()}
	}
	o, err := goredis.ParseURL(raw)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			return nil, &URLError{URL: RedactURL(raw), Reason: errBadURL.Error()}
		}
		// Otherwise go-redis names a bad database number, path or query parameter; a plain URL
		// holds no piece of its password there.
		return nil, &URLError{URL: RedactURL(raw), Reason: strings.TrimPrefix(err.Error(), "redis: ")}
	}
	return o, nil
}

// checkHostPort checks the host and port of a redis:// or rediss:// URL, which url.Parse would
// only call "invalid" (or, for a port above 65535, accept).
func checkHostPort(raw, scheme string) error {
	rest := raw[len(scheme)+len("://"):]
	// The host follows the last '@': a host holds none, and a password's '@' is before it.
	at := strings.LastIndexByte(rest, '@')
	hostport := rest[at+1:]
	if i := strings.IndexAny(hostport, "/?#"); i >= 0 {
		hostport = hostport[:i]
	}
	host, port, hasPort := hostport, "", false
	if strings.HasPrefix(hostport, "[") {
		end := strings.IndexByte(hostport, ']')
		if end < 0 {
			return &URLError{URL: RedactURL(raw), Reason: "an IPv6 address lacks its closing ']'"}
		}
		host = hostport[:end+1]
		switch after := hostport[end+1:]; {
		case after == "":
		case after[0] == ':':
			port, hasPort = after[1:], true
		default:
			return &URLError{URL: RedactURL(raw), Reason: "after an IPv6 address in brackets comes ':PORT' or nothing"}
		}
	} else if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		if strings.Count(hostport, ":") > 1 && net.ParseIP(hostport[:i]) != nil {
			return &URLError{URL: RedactURL(raw), Reason: "put an IPv6 address in brackets: " + scheme + "://[::1]:6379"}
		}
		host, port, hasPort = hostport[:i], hostport[i+1:], true
	}
	if !hasPort || port == "" || validPort(port) {
		return nil
	}
	// Without an '@', what looks like "host:port" may be "user:password" of a URL that lost its
	// host; the port is quoted only where the host is clearly an address.
	if at >= 0 || looksLikeAddress(host) {
		shown := RedactURL(raw)
		if at < 0 && safeHost(hostport) {
			shown = scheme + "://" + hostport
		}
		return &URLError{URL: shown, Reason: fmt.Sprintf("the port %q is not a number from 1 to 65535", port)}
	}
	return &URLError{URL: RedactURL(raw), Reason: "the port is not a number from 1 to 65535 (it is not shown, in case it is " +
		"a password: a URL with credentials is " + scheme + "://USER:PASSWORD@HOST:PORT)"}
}

// validPort reports whether s is a TCP port number, 1 to 65535.
func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535 && strings.Trim(s, "0123456789") == ""
}

// looksLikeAddress reports whether host is clearly a host and not a user name: an IP address,
// "localhost", or a name with a dot.
func looksLikeAddress(host string) bool {
	h := strings.Trim(host, "[]")
	return net.ParseIP(h) != nil || strings.EqualFold(h, "localhost") || strings.Contains(h, ".") && safeHost(h)
}
