package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

// closedPort returns a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func TestConnectionErrorsHideThePassword(t *testing.T) {
	addr := closedPort(t)
	path, _ := testPipeline(t, ordersPipeline)
	commands := [][]string{{"produce", path, "orders"}, {"tail", path, "orders"}, {"inspect", path}}
	for _, url := range []string{
		"redis://app:s3cr3t-pw@" + addr + "/0",
		"rediss://:s3cr3t-pw@" + addr,
		"redis://app:s3cr3t-pw@" + addr + ",redis://app:s3cr3t-pw@" + closedPort(t), // cluster seeds
		"redis://app:s3cr3t,pw@" + addr,                                             // a comma in the password
		"redis://app:s3cr3t,pw@" + addr + "," + closedPort(t),                       // and seeds
		"redis://app:s3cr3t%40pw%2Fs3cr3t:pw%25 s3cr3t@" + addr,                     // @ / : % encoded, a space not
	} {
		want := ExitError
		if strings.Contains(url, " ") { // not a valid URL: found before dialling
			want = ExitInvalid
		}
		for _, args := range commands {
			code, out, errOut := runIn(t, `{"customer_id":"a"}`, append(args, "--redis", url)...)
			if code != want || out != "" {
				t.Errorf("%s --redis %s: exit %d, stdout %q", args[0], url, code, out)
			}
			if strings.Contains(errOut, "s3cr3t") || !strings.Contains(errOut, addr) || !strings.Contains(errOut, "xxxxx") {
				t.Errorf("%s: the error must name %s and hide the password:\n%s", args[0], addr, errOut)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "Error: ") {
				t.Errorf("%s: want one line:\n%s", args[0], errOut)
			}
		}
	}
	// The same from the environment.
	t.Setenv(EnvRedisURL, "redis://app:s3cr3t-pw@"+addr)
	if code, _, errOut := runIn(t, "", "inspect", path); code != ExitError || strings.Contains(errOut, "s3cr3t") || !strings.Contains(errOut, addr) {
		t.Errorf("%s: exit %d\n%s", EnvRedisURL, code, errOut)
	}
}

func TestRedisURLFromTheEnvironment(t *testing.T) {
	srv := redistest.Shared(t)
	path, _ := testPipeline(t, ordersPipeline)
	t.Setenv(EnvRedisURL, srv.URL())
	if code, out, errOut := runIn(t, "", "inspect", "--json", path); code != ExitOK || !strings.Contains(out, `"redis": "redis://`+srv.Addr()) {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	// --redis wins over the environment.
	t.Setenv(EnvRedisURL, "redis://"+closedPort(t))
	if code, _, errOut := runIn(t, "", "inspect", "--redis", srv.URL(), path); code != ExitOK {
		t.Fatalf("--redis did not win over %s: exit %d\n%s", EnvRedisURL, code, errOut)
	}
}

func TestConnectEmbedded(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	ctx := testContext(t)
	var f redisFlags
	var stderr bytes.Buffer
	if _, _, err := f.connect(ctx, &stderr, false); err == nil || !strings.Contains(err.Error(), "no Redis configured") {
		t.Fatalf("without a Redis and without the embedded one: %v", err)
	}
	c, closeRedis, err := f.connect(ctx, &stderr, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "embedded in-memory Redis") || !strings.Contains(stderr.String(), "lost") {
		t.Errorf("connect did not say it uses the embedded Redis: %q", stderr.String())
	}
	if err := c.Client().Universal().XAdd(ctx, &goredis.XAddArgs{Stream: "s", Values: []any{"payload", "{}"}}).Err(); err != nil {
		t.Fatal(err)
	}
	closeRedis()
	if err := c.Client().Universal().Ping(ctx).Err(); err == nil {
		t.Fatal("the client still works after the close function")
	}
}

// go-redis prints some failures on standard error by itself; flowrun must say it once, in one
// line. The command runs in a child process (this test binary), whose standard error is read.
func TestConnectionErrorIsTheOnlyLine(t *testing.T) {
	const env = "FLOWRUN_TEST_STDERR_CHILD"
	if args := os.Getenv(env); args != "" {
		os.Exit(Execute(context.Background(), strings.Split(args, "\n"), IO{In: strings.NewReader(""), Out: os.Stdout, Err: os.Stderr}))
	}
	path, _ := testPipeline(t, ordersPipeline)
	tlsSrv := redistest.Start(t, redistest.WithTLS())
	for _, url := range []string{"redis://app:s3cr3t@" + closedPort(t), closedPort(t) + "," + closedPort(t),
		"redis://app:s3cr3t@" + tlsSrv.Addr(), // WRONGPASS
		tlsSrv.TLSURL(),                       // a certificate signed by an unknown CA
	} {
		for _, args := range [][]string{{"inspect", path}, {"tail", path, "orders"}, {"produce", path, "orders"}} {
			args = append(args, "--redis", url)
			// The deadline only keeps a regression (a command that retries for ever) from hanging
			// the test: the child is killed, and its output shown.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestConnectionErrorIsTheOnlyLine$")
			cmd.Env = append(os.Environ(), env+"="+strings.Join(args, "\n"))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			expired := ctx.Err() != nil
			cancel()
			if expired {
				t.Fatalf("%v: still running after 2 minutes, killed\n%s%s", args, stdout.String(), stderr.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != ExitError {
				t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
			}
			if stdout.Len() != 0 || strings.Count(stderr.String(), "\n") != 1 || !strings.HasPrefix(stderr.String(), "Error: redis: connecting to ") {
				t.Errorf("%v: want one line of error:\nstdout %q\nstderr %q", args, stdout.String(), stderr.String())
			}
			if strings.Contains(stderr.String(), "s3cr3t") {
				t.Errorf("%v: the password shows: %s", args, stderr.String())
			}
		}
	}
}

// jobPipeline is a small job: a generate source into a stdout sink.
const jobPipeline = `
topic "t" { partitions = 2 }
source "gen" {
  kind     = "generate"
  count    = 5
  output   = topic.t
  template = { n = index }
}
sink "out" {
  kind  = "stdout"
  input = topic.t
}
`

// redisCommands are the commands that take --redis, with the arguments they need besides it.
func redisCommands(path string) [][]string {
	return [][]string{
		{"run", path, "--until-drained"}, {"produce", path, "t"}, {"tail", path, "t"}, {"inspect", path},
		{"dlq", "list", path, "--stage", "out"},
	}
}

// oneErrorLine checks that stderr is one line of error and returns it.
func oneErrorLine(t *testing.T, what, stderr string) string {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "Error: ") {
		t.Errorf("%s: want one line of error:\n%s", what, stderr)
	}
	return stderr
}

// A URL that cannot be used is the command line's fault: exit 2, saying what is wrong, before
// anything is dialled.
func TestInvalidRedisURLsExitTwo(t *testing.T) {
	path, _ := testPipeline(t, jobPipeline)
	for _, tc := range []struct {
		url  string
		want []string
	}{
		{"redis://127.0.0.1:notaport", []string{`port "notaport"`, "redis://127.0.0.1:notaport"}},
		{"http://x:1", []string{`scheme "http"`, "redis://", "rediss://", "unix://"}},
		{"redis://localhost:6379/db", []string{"database number"}},
		{"redis://app:s3cr3t", []string{"port is not a number"}}, // a host lost: "s3cr3t" may be a password
		{"redis://a:1/1,redis://b:2", []string{"db 1"}},
	} {
		for _, args := range redisCommands(path) {
			code, out, errOut := runIn(t, "", append(args, "--redis", tc.url)...)
			if code != ExitInvalid || out != "" {
				t.Errorf("%s --redis %s: exit %d, stdout %q, want exit %d", args[0], tc.url, code, out, ExitInvalid)
			}
			msg := oneErrorLine(t, args[0]+" --redis "+tc.url, errOut)
			for _, w := range append(tc.want, "--redis: invalid URL") {
				if !strings.Contains(msg, w) {
					t.Errorf("%s --redis %s: the error lacks %q: %s", args[0], tc.url, w, msg)
				}
			}
			if strings.Contains(msg, "s3cr3t") {
				t.Errorf("the password shows: %s", msg)
			}
		}
	}
	t.Setenv(EnvRedisURL, "http://x:1")
	if code, _, errOut := runIn(t, "", "inspect", path); code != ExitInvalid || !strings.Contains(errOut, EnvRedisURL+`: invalid URL http://x:1: unsupported scheme "http"`) {
		t.Errorf("%s: exit %d: %s", EnvRedisURL, code, errOut)
	}
}

// host:port alone is a plain TCP URL: redis://host:port.
func TestBareHostPortIsARedisURL(t *testing.T) {
	srv := redistest.Shared(t)
	path, _ := testPipeline(t, jobPipeline)
	if code, out, errOut := runIn(t, "", "inspect", "--json", path, "--redis", srv.Addr()); code != ExitOK || !strings.Contains(out, `"redis": "redis://`+srv.Addr()) {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
}

func TestTLSFlags(t *testing.T) {
	srv := redistest.Start(t, redistest.WithTLS())
	mutual := redistest.Start(t, redistest.WithTLSClientAuth())
	path, _ := testPipeline(t, jobPipeline)
	cert, key := mutual.TLSClientFiles()
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	job := func(url string, flags ...string) (int, string, string) {
		t.Helper()
		return runIn(t, "", append([]string{"run", path, "--until-drained", "--redis", url}, flags...)...)
	}
	// Trusting the private CA: the job runs over TLS and ends.
	for name, tc := range map[string]struct {
		srv   *redistest.Server
		flags []string
	}{
		"the server's CA":           {srv, []string{"--redis-ca", srv.TLSCAFile()}},
		"a client certificate":      {mutual, []string{"--redis-ca", mutual.TLSCAFile(), "--redis-cert", cert, "--redis-key", key}},
		"a client cert to a server": {srv, []string{"--redis-ca", srv.TLSCAFile(), "--redis-cert", cert, "--redis-key", key}},
	} {
		code, out, errOut := job(tc.srv.TLSURL(), tc.flags...)
		if code != ExitOK || strings.Count(out, "\n") != 5 {
			t.Errorf("%s: exit %d, stdout %q\n%s", name, code, out, errOut)
		}
	}
	// The same from the environment.
	t.Setenv(EnvRedisCA, mutual.TLSCAFile())
	t.Setenv(EnvRedisCert, cert)
	t.Setenv(EnvRedisKey, key)
	if code, _, errOut := job(mutual.TLSURL()); code != ExitOK {
		t.Errorf("TLS files from the environment: exit %d\n%s", code, errOut)
	}
	// Files from the environment are not applied to a plain connection (a shell set up for a TLS
	// server can still reach a local one); given as flags, they are a mistake (see below).
	if code, _, errOut := runIn(t, "", "inspect", path, "--redis", srv.URL()); code != ExitOK {
		t.Errorf("TLS files in the environment, a redis:// URL: exit %d\n%s", code, errOut)
	}
	t.Setenv(EnvRedisCA, "")
	t.Setenv(EnvRedisCert, "")
	t.Setenv(EnvRedisKey, "")

	// What the server refuses: exit 1, one line, and what to do.
	for name, tc := range map[string]struct {
		srv   *redistest.Server
		flags []string
		want  string
	}{
		"no CA":             {srv, nil, "--redis-ca FILE"},
		"another CA":        {srv, []string{"--redis-ca", mutual.TLSCAFile()}, "not signed by a CA of --redis-ca " + mutual.TLSCAFile()},
		"no client cert":    {mutual, []string{"--redis-ca", mutual.TLSCAFile()}, "requires a client certificate: give it with --redis-cert FILE and --redis-key FILE"},
		"a plain port":      {nil, []string{"--redis-ca", srv.TLSCAFile()}, ""},
		"plain to TLS port": {srv, nil, "use rediss://"},
	} {
		url := ""
		switch name {
		case "a plain port":
			continue // no TLS answer only shows after the dial timeout; transport/redis tests it
		case "plain to TLS port":
			url = "redis://" + tc.srv.TLSAddr()
		default:
			url = tc.srv.TLSURL()
		}
		code, out, errOut := job(url, tc.flags...)
		msg := oneErrorLine(t, name, errOut)
		if code != ExitError || out != "" || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: exit %d, stdout %q, want exit %d and %q:\n%s", name, code, out, ExitError, tc.want, msg)
		}
	}

	// Flags that cannot be used: exit 2, naming the flag, on every command that takes --redis.
	for name, tc := range map[string]struct {
		url   string
		flags []string
		want  string
	}{
		"a missing CA file": {srv.TLSURL(), []string{"--redis-ca", "/nonexistent/ca.pem"}, "--redis-ca: open /nonexistent/ca.pem"},
		"a CA without PEM":  {srv.TLSURL(), []string{"--redis-ca", notPEM}, "--redis-ca: " + notPEM + " holds no PEM certificate"},
		"a cert, no key":    {srv.TLSURL(), []string{"--redis-cert", cert}, "--redis-cert needs --redis-key"},
		"a key, no cert":    {srv.TLSURL(), []string{"--redis-key", key}, "--redis-key needs --redis-cert"},
		"a bad cert":        {srv.TLSURL(), []string{"--redis-cert", notPEM, "--redis-key", key}, "--redis-cert and --redis-key: " + notPEM},
		"TLS files, no TLS": {srv.URL(), []string{"--redis-ca", srv.TLSCAFile()}, "--redis-ca is for TLS connections"},
	} {
		for _, args := range redisCommands(path) {
			code, out, errOut := runIn(t, "", append(append(args, "--redis", tc.url), tc.flags...)...)
			msg := oneErrorLine(t, name, errOut)
			if code != ExitInvalid || out != "" || !strings.Contains(msg, tc.want) {
				t.Errorf("%s, %s: exit %d, stdout %q, want exit %d and %q:\n%s", name, args[0], code, out, ExitInvalid, tc.want, msg)
			}
		}
	}
	// TLS files without a Redis (the embedded one speaks no TLS).
	t.Setenv(EnvRedisURL, "")
	if code, _, errOut := runIn(t, "", "run", path, "--until-drained", "--redis-ca", srv.TLSCAFile()); code != ExitInvalid || !strings.Contains(errOut, "--redis-ca is for TLS connections") {
		t.Errorf("--redis-ca without --redis: exit %d: %s", code, errOut)
	}
}

// TLS to a Redis Cluster whose nodes require a client certificate (and speak TLS on the cluster
// bus): a job seeded with every node's rediss:// URL writes to partitions on every node, inspect
// seeded with one node finds the others over TLS, and without a client certificate the run is
// refused with what to give.
func TestTLSOnACluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, redistest.WithTLSClientAuth())
	path, prefix := testPipeline(t, `
topic "t" { partitions = 6 }
source "gen" {
  kind     = "generate"
  count    = 30
  output   = topic.t
  template = { n = index }
}
sink "out" {
  kind  = "stdout"
  input = topic.t
}
`)
	cert, key := cl.TLSClientFiles()
	tlsFlags := []string{"--redis-ca", cl.TLSCAFile(), "--redis-cert", cert, "--redis-key", key}
	code, out, errOut := runIn(t, "", append([]string{"run", path, "--until-drained", "--redis", strings.Join(cl.TLSURLs(), ",")}, tlsFlags...)...)
	if code != ExitOK || strings.Count(out, "\n") != 30 {
		t.Fatalf("a job over TLS on a cluster: exit %d, %d lines\n%s", code, strings.Count(out, "\n"), errOut)
	}
	for _, node := range cl.Nodes() {
		keys, err := node.Client(t).Keys(context.Background(), prefix+":{t:*").Result()
		if err != nil || len(keys) == 0 {
			t.Errorf("node %s holds none of the topic's partitions (%v): the job did not reach it", node.Addr(), err)
		}
	}
	code, out, errOut = runIn(t, "", append([]string{"inspect", path, "--json", "--redis", cl.TLSURLs()[0]}, tlsFlags...)...)
	var report struct {
		Topics []struct {
			Length     int
			Partitions []struct{ Length int }
		}
	}
	if err := json.Unmarshal([]byte(out), &report); code != ExitOK || err != nil || len(report.Topics) != 1 || report.Topics[0].Length != 30 {
		t.Fatalf("inspect over TLS seeded with one node: exit %d (%v), want a topic of 30\n%s%s", code, err, out, errOut)
	}
	for p, part := range report.Topics[0].Partitions {
		if part.Length == 0 {
			t.Errorf("inspect read nothing of partition %d", p)
		}
	}
	code, out, errOut = runIn(t, "", "run", path, "--until-drained", "--redis", strings.Join(cl.TLSURLs(), ","), "--redis-ca", cl.TLSCAFile())
	if msg := oneErrorLine(t, "no client certificate", errOut); code != ExitError || out != "" || !strings.Contains(msg, "requires a client certificate") {
		t.Errorf("no client certificate: exit %d, stdout %q: %s", code, out, msg)
	}
}

// A user without what the pipeline needs ends flowrun run at start: exit 1, one line naming the
// command or the key and how to grant it, and nothing read or written: the input topic keeps all
// its entries, unread, in no consumer group.
func TestRunChecksPermissionsAtStart(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := testContext(t)
	path, prefix := testPipeline(t, `
topic "orders" { partitions = 2 }
topic "big" { partitions = 1 }
stage "pick" {
  kind   = "filter"
  input  = topic.orders
  output = topic.big
  where  = msg.n > 1
}
sink "out" {
  kind  = "stdout"
  input = topic.big
}
`)
	if code, _, errOut := runIn(t, `{"n":1}`+"\n"+`{"n":2}`+"\n"+`{"n":3}`+"\n", "produce", path, "orders", "--redis", srv.URL()); code != ExitOK {
		t.Fatalf("produce: exit %d\n%s", code, errOut)
	}
	untouched := func(t *testing.T, what string) {
		t.Helper()
		var entries int64
		for p := range 2 {
			stream := prefix + ":{orders:" + strconv.Itoa(p) + "}"
			n, err := admin.XLen(ctx, stream).Result()
			if err != nil {
				t.Fatal(err)
			}
			entries += n
			if groups, err := admin.XInfoGroups(ctx, stream).Result(); err != nil && n > 0 || len(groups) > 0 {
				t.Errorf("%s: %s has consumer groups %v (%v)", what, stream, groups, err)
			}
		}
		if entries != 3 {
			t.Errorf("%s: the input topic holds %d entries, want 3", what, entries)
		}
		keys, err := admin.Keys(ctx, prefix+":*").Result()
		if err != nil || len(keys) != 2 {
			t.Errorf("%s: keys %v (%v), want only the input topic's two streams", what, keys, err)
		}
	}
	acl := func(user string, rules ...string) {
		args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw"}
		for _, r := range rules {
			args = append(args, r)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	acl("other", "~other:*", "+@all")
	acl("noclaim", "~"+prefix+":*", "+@all", "-xautoclaim")
	acl("noscripts", "~"+prefix+":*", "+@all", "-@scripting")
	for _, tc := range []struct {
		url  string
		want []string
	}{
		{"redis://other:pw@" + srv.Addr(), []string{`redis user "other" may not access the key ` + prefix + ":", "ACL SETUSER other ~" + prefix + ":*"}},
		{"redis://noclaim:pw@" + srv.Addr(), []string{`redis user "noclaim" may not run XAUTOCLAIM`, "ACL SETUSER noclaim +xautoclaim"}},
		{"redis://noscripts:pw@" + srv.Addr(), []string{`redis user "noscripts" may not run EVAL`, "+eval +evalsha"}},
		{"redis://other:wrong@" + srv.Addr(), []string{"WRONGPASS", "refused the user name and password of --redis"}},
	} {
		code, out, errOut := runIn(t, "", "run", path, "--until-drained", "--redis", tc.url)
		msg := oneErrorLine(t, tc.url, errOut)
		if code != ExitError || out != "" {
			t.Errorf("%s: exit %d, stdout %q, want exit %d", tc.url, code, out, ExitError)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: the error lacks %q: %s", tc.url, w, msg)
			}
		}
		if strings.Contains(msg, ":pw@") || strings.Contains(msg, ":wrong@") {
			t.Errorf("the password shows: %s", msg)
		}
		untouched(t, tc.url)
	}
	// The same user with the rule it was given runs the job.
	acl("granted", "~other:*", "+@all")
	code, _, errOut := runIn(t, "", "run", path, "--until-drained", "--redis", "redis://granted:pw@"+srv.Addr())
	rule := strings.TrimSpace(errOut[strings.Index(errOut, "ACL SETUSER"):])
	args := []any{}
	for _, w := range strings.Fields(rule) {
		args = append(args, w)
	}
	if code != ExitError || admin.Do(ctx, args...).Err() != nil {
		t.Fatalf("exit %d, %s", code, errOut)
	}
	if code, out, errOut := runIn(t, "", "run", path, "--until-drained", "--redis", "redis://granted:pw@"+srv.Addr()); code != ExitOK || strings.Count(out, "\n") != 2 {
		t.Fatalf("after %s: exit %d, stdout %q\n%s", rule, code, out, errOut)
	}
	// A server that requires a password, given none.
	if err := admin.Do(ctx, "CONFIG", "SET", "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runIn(t, "", "run", path, "--until-drained", "--redis", srv.URL())
	if msg := oneErrorLine(t, "NOAUTH", errOut); code != ExitError || !strings.Contains(msg, "NOAUTH") || !strings.Contains(msg, "requires a password") {
		t.Errorf("no password: exit %d: %s", code, msg)
	}
}

// A server that lacks a command the pipeline needs (renamed away) ends flowrun run at start.
func TestRunChecksCommandsAtStart(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--rename-command", "XAUTOCLAIM", ""))
	path, _ := testPipeline(t, jobPipeline)
	code, out, errOut := runIn(t, "", "run", path, "--until-drained", "--redis", srv.URL())
	msg := oneErrorLine(t, "rename-command", errOut)
	if code != ExitError || out != "" || !strings.Contains(msg, "the Redis server does not know the command XAUTOCLAIM (needed by sink out)") {
		t.Errorf("exit %d, stdout %q: %s", code, out, msg)
	}
}
