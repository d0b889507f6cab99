package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

func TestParseURLs(t *testing.T) {
	got := ParseURLs("redis://a:1, redis://b:2", "", " c:3 ,", "rediss://u:p@d:4/0")
	want := []string{"redis://a:1", "redis://b:2", "redis://c:3", "rediss://u:p@d:4/0"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseURLs = %q, want %q", got, want)
	}
}

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"redis://app:s3cret@host:6379/1":  "redis://app:xxxxx@host:6379/1",
		"rediss://:s3cret@host:6380":      "rediss://:xxxxx@host:6380",
		"redis://host:6379":               "redis://host:6379",
		"redis://app:s3 cr%et@host:6379/": "redis://xxxxx@host:6379/",
	}
	for in, want := range cases {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenErrorsNeverShowThePassword(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"redis://app:s3cret@127.0.0.1:1/0",          // refused
		"redis://app:s3cret%zzs3cret@127.0.0.1:1/0", // does not parse
		"ftp://app:s3cret@127.0.0.1:1/0",            // bad scheme
		"redis://app:s3cret@127.0.0.1:1/notadb",     // bad db
	} {
		_, err := Open(ctx, Options{URLs: []string{u}, DialTimeout: 200 * time.Millisecond})
		if err == nil {
			t.Fatalf("Open(%q) succeeded", u)
		}
		if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "%zz") {
			t.Errorf("Open(%q) error shows the password: %v", u, err)
		}
		if !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Errorf("Open(%q) error does not name the address: %v", u, err)
		}
	}
	if _, err := Open(ctx, Options{}); err == nil {
		t.Error("Open without URL succeeded")
	}
}

func TestOpenWithACLUserAndDB(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">s3cret", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	u := "redis://app:s3cret@" + srv.Addr() + "/3"
	c := openURLs(t, u)
	if c.IsCluster() {
		t.Fatal("a single server opened as a cluster")
	}
	if s := c.String(); strings.Contains(s, "s3cret") || !strings.Contains(s, srv.Addr()) {
		t.Fatalf("String() = %q", s)
	}
	if err := c.Universal().Set(ctx, "in-db-3", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The key went to db 3, not db 0.
	if n, _ := admin.Exists(ctx, "in-db-3").Result(); n != 0 {
		t.Fatal("a key written through a /3 URL is in db 0")
	}
	if v, err := admin.Do(ctx, "EVAL", "redis.call('SELECT', 3) return redis.call('GET', 'in-db-3')", 0).Text(); err != nil || v != "1" {
		t.Fatalf("db 3 holds %q, %v", v, err)
	}
	_, err := Open(ctx, Options{URLs: []string{"redis://app:wrong@" + srv.Addr()}})
	if err == nil || strings.Contains(err.Error(), "wrong@") || !strings.Contains(err.Error(), srv.Addr()) {
		t.Fatalf("wrong password: err = %v", err)
	}
}

func TestOpenCluster(t *testing.T) {
	ctx := ctxT(t)
	cl := redistest.SharedCluster(t, 3)
	for name, urls := range map[string][]string{
		"all seeds":       cl.URLs(),
		"comma-separated": {strings.Join(cl.Addrs(), ",")},
		"single node URL": {cl.URLs()[1]},
		"bare host:port":  {cl.Addrs()[2]},
	} {
		t.Run(name, func(t *testing.T) {
			c := openURLs(t, urls...)
			if !c.IsCluster() {
				t.Fatal("not opened as a cluster")
			}
			// Keys in every slot range work: the client follows the cluster's slot map.
			k := testKeys(t)
			for p := range 8 {
				if err := c.Universal().Set(ctx, k.Stream("x", p), "v", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	if _, err := Open(ctx, Options{URLs: []string{cl.URLs()[0] + "/2", cl.URLs()[1]}}); err == nil || !strings.Contains(err.Error(), "db 2") {
		t.Fatalf("cluster seeds with a db: err = %v", err)
	}
}

func TestOpenMiniredisIsNotACluster(t *testing.T) {
	c := miniredisBackend().open(t)
	if c.IsCluster() {
		t.Fatal("miniredis opened as a cluster")
	}
}

func TestNoGroupError(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		_, err := c.ReadGroup(ctxT(t), ReadArgs{Stream: k.Stream("none", 0), Group: "g", Consumer: "c", Block: -1})
		if !errors.Is(err, ErrNoGroup) {
			t.Fatalf("err = %v, want ErrNoGroup", err)
		}
	})
}

func TestOpenTLS(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t, redistest.WithTLS())
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "app", "on", ">s3cret", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	u := "rediss://app:s3cret@" + srv.TLSAddr() + "/0"
	// The server's certificate is signed by a private CA: without it, verification fails, and
	// the error names the address but not the password.
	_, err := Open(ctx, Options{URLs: []string{u}})
	if err == nil || !strings.Contains(err.Error(), "certificate") || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), srv.TLSAddr()) {
		t.Fatalf("untrusted certificate: err = %v", err)
	}
	c, err := Open(ctx, Options{URLs: []string{u}, TLSConfig: srv.TLSConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := testKeys(t)
	if err := c.EnsureGroup(ctx, k.Stream("tls", 0), "g"); err != nil {
		t.Fatal(err)
	}
	// A plain client on the TLS port fails.
	if _, err := Open(ctx, Options{URLs: []string{"redis://" + srv.TLSAddr()}, ReadTimeout: 500 * time.Millisecond}); err == nil {
		t.Fatal("plain connection to the TLS port succeeded")
	}
}

func TestDialAttempts(t *testing.T) {
	seed := func(u string) *goredis.Options {
		o, err := parseURL(u)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	for _, tc := range []struct {
		opts Options
		want int
	}{
		{Options{}, DefaultDialAttempts},
		{Options{DialAttempts: 4}, 4},
	} {
		o := seed("redis://127.0.0.1:1")
		singleOptions(tc.opts, o)
		if o.DialerRetries != tc.want {
			t.Errorf("single server with %+v: DialerRetries = %d, want %d", tc.opts, o.DialerRetries, tc.want)
		}
		co, err := clusterOptions(tc.opts, []*goredis.Options{seed("redis://127.0.0.1:1"), seed("redis://127.0.0.1:2")}, []string{"a", "b"})
		if err != nil {
			t.Fatal(err)
		}
		if co.DialerRetries != tc.want {
			t.Errorf("cluster with %+v: DialerRetries = %d, want %d", tc.opts, co.DialerRetries, tc.want)
		}
	}
	if DefaultDialAttempts != 1 {
		t.Errorf("DefaultDialAttempts = %d: a dead Redis should be reported after one dial", DefaultDialAttempts)
	}
}

// Query parameters of a single server's URL count where Options leaves the field zero.
func TestURLQueryParameters(t *testing.T) {
	u := "redis://127.0.0.1:1/0?dial_timeout=3s&read_timeout=4s&write_timeout=6s&pool_size=7&client_name=mine&max_retries=2"
	o, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	singleOptions(Options{}, o)
	if o.DialTimeout != 3*time.Second || o.ReadTimeout != 4*time.Second || o.WriteTimeout != 6*time.Second ||
		o.PoolSize != 7 || o.ClientName != "mine" || o.MaxRetries != 2 {
		t.Errorf("from the URL: %+v", o)
	}
	o, _ = parseURL(u)
	singleOptions(Options{DialTimeout: time.Second, PoolSize: 3, ClientName: "theirs", MaxRetries: 1}, o)
	if o.DialTimeout != time.Second || o.ReadTimeout != 4*time.Second || o.PoolSize != 3 || o.ClientName != "theirs" || o.MaxRetries != 1 {
		t.Errorf("Options win over the URL: %+v", o)
	}
	o, _ = parseURL("redis://127.0.0.1:1")
	singleOptions(Options{}, o)
	if o.DialTimeout != DefaultDialTimeout || o.ReadTimeout != DefaultReadTimeout || o.WriteTimeout != DefaultWriteTimeout ||
		o.PoolSize != DefaultPoolSize || o.ClientName != DefaultClientName || o.MaxRetries != -1 {
		t.Errorf("defaults: %+v", o)
	}
}

// Open tells why a connection failed, so that a caller can say what to do about it.
func TestConnectProblems(t *testing.T) {
	ctx := ctxT(t)
	mutual := redistest.Start(t, redistest.WithTLSClientAuth())
	tlsOnly := redistest.Start(t, redistest.WithTLS())
	locked := redistest.Start(t)
	if err := mutual.Client(t).Do(ctx, "ACL", "SETUSER", "nosetname", "on", ">pw", "~*", "+@all", "-client|setname", "-hello").Err(); err != nil {
		t.Fatal(err)
	}
	if err := locked.Client(t).Do(ctx, "CONFIG", "SET", "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	trusting := tlsOnly.TLSConfig()
	noClientCert := mutual.TLSConfig()
	noClientCert.Certificates = nil
	wrongName := tlsOnly.TLSConfig()
	wrongName.ServerName = "redis.example"
	for name, tc := range map[string]struct {
		opts Options
		want ConnectProblem
	}{
		"refused":             {Options{URLs: []string{"redis://" + closedAddr(t)}}, ConnectUnreachable},
		"wrong password":      {Options{URLs: []string{"redis://:wrong@" + locked.Addr()}}, ConnectWrongPassword},
		"no password":         {Options{URLs: []string{locked.URL()}}, ConnectNeedsPassword},
		"no CLIENT SETNAME":   {Options{URLs: []string{"redis://nosetname:pw@" + mutual.Addr()}}, ConnectNoPermission},
		"untrusted CA":        {Options{URLs: []string{tlsOnly.TLSURL()}}, ConnectUntrustedCertificate},
		"wrong host":          {Options{URLs: []string{tlsOnly.TLSURL()}, TLSConfig: wrongName}, ConnectWrongHost},
		"no client cert":      {Options{URLs: []string{mutual.TLSURL()}, TLSConfig: noClientCert}, ConnectClientCertificate},
		"plain to TLS port":   {Options{URLs: []string{"redis://" + tlsOnly.TLSAddr()}}, ConnectTLSOnly},
		"TLS to a plain port": {Options{URLs: []string{"rediss://" + tlsOnly.Addr()}, TLSConfig: trusting, DialTimeout: 200 * time.Millisecond}, ConnectNotTLS},
	} {
		c, err := Open(ctx, tc.opts)
		if err == nil {
			_ = c.Close()
			t.Errorf("%s: connected", name)
			continue
		}
		var cerr *ConnectError
		if !errors.As(err, &cerr) {
			t.Errorf("%s: %v is not a *ConnectError", name, err)
			continue
		}
		if got := cerr.Problem(); got != tc.want {
			t.Errorf("%s: Problem() = %d, want %d (%v)", name, got, tc.want, err)
		}
		if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "wrong@") {
			t.Errorf("%s: the password shows: %v", name, err)
		}
		// A TLS 1.3 server that refuses a client says so in an alert, which the client may read
		// (Unrecoverable) or not, when the server closed the connection first (a reset, which is
		// worth retrying elsewhere).
		if tc.want == ConnectClientCertificate {
			continue
		}
		if unrecoverable := tc.want != ConnectUnreachable && tc.want != ConnectNotTLS && tc.want != ConnectTLSOnly; Unrecoverable(err) != unrecoverable {
			t.Errorf("%s: Unrecoverable = %v: %v", name, !unrecoverable, err)
		}
	}
	// The client certificate and the CA loaded from their PEM files work.
	pool, err := LoadCertPool(mutual.TLSCAFile())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := LoadClientCertificate(mutual.TLSClientFiles())
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(ctx, Options{URLs: []string{mutual.TLSURL()}, TLSConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
}

func TestLoadTLSFiles(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t, redistest.WithTLS())
	cert, key := srv.TLSClientFiles()
	if _, err := LoadCertPool(filepath.Join(dir, "missing.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing CA file: %v", err)
	}
	if _, err := LoadCertPool(notPEM); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a CA file without PEM: %v", err)
	}
	if _, err := LoadClientCertificate(cert, filepath.Join(dir, "missing.key")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing key: %v", err)
	}
	if _, err := LoadClientCertificate(notPEM, key); err == nil || !strings.Contains(err.Error(), notPEM) {
		t.Errorf("a certificate without PEM: %v", err)
	}
	if _, err := LoadClientCertificate(cert, srv.TLSCAFile()); err == nil {
		t.Error("a certificate as its own key was accepted")
	}
}
