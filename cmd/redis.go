package cmd

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/internal/embedded"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// EnvRedisURL is the environment variable that locates Redis when --redis is not given. It takes
// the same syntax as the flag: one URL, or several comma-separated cluster seeds.
const EnvRedisURL = "FLOWRUN_REDIS_URL"

// redisFlags are the connection flags of every command that talks to Redis.
type redisFlags struct{ urls []string }

func (f *redisFlags) register(c *cobra.Command) {
	c.Flags().StringArrayVar(&f.urls, "redis", nil,
		"Redis to use, as redis://[user:password@]host:port[/db] or rediss://... for TLS; repeat it or separate "+
			"URLs with commas to give the seeds of a Redis Cluster (default $"+EnvRedisURL+")")
}

// configured returns the URLs from --redis, or else from FLOWRUN_REDIS_URL, split and trimmed;
// none when neither says anything.
func (f *redisFlags) configured() []string {
	if urls := redis.ParseURLs(f.urls...); len(urls) > 0 {
		return urls
	}
	return redis.ParseURLs(os.Getenv(EnvRedisURL))
}

// connect opens the configured Redis (--redis, else FLOWRUN_REDIS_URL) and returns the client and
// a function that closes it. With none configured and allowEmbedded, it starts the embedded
// in-memory Redis and says so on stderr, since its data does not survive the process; without
// allowEmbedded it fails with a message saying how to configure one. Its errors are exitErrors
// (exit code 1) of one line that name the address but never the password.
func (f *redisFlags) connect(ctx context.Context, stderr io.Writer, allowEmbedded bool) (*redis.Client, func(), error) {
	urls := f.configured()
	if len(urls) > 0 {
		c, err := redis.Open(ctx, redis.Options{URLs: urls})
		if err != nil {
			return nil, nil, exitError{code: ExitError, message: connectionError(err, urls)}
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
	c, err := redis.Open(ctx, redis.Options{URLs: []string{srv.URL()}})
	if err != nil {
		srv.Close()
		return nil, nil, exitError{code: ExitError, message: "the embedded Redis: " + oneLine(err.Error())}
	}
	fmt.Fprintf(stderr, "flowrun: no Redis configured (--redis or %s): using an embedded in-memory Redis at %s; "+
		"its data is lost when flowrun exits\n", EnvRedisURL, srv.Addr())
	return c, func() { _ = c.Close(); srv.Close() }, nil
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
