package cmd

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

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
		for _, args := range commands {
			code, out, errOut := runIn(t, `{"customer_id":"a"}`, append(args, "--redis", url)...)
			if code != ExitError || out != "" {
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
	if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: "s", Values: []any{"payload", "{}"}}).Err(); err != nil {
		t.Fatal(err)
	}
	closeRedis()
	if err := c.Universal().Ping(ctx).Err(); err == nil {
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
	for _, url := range []string{"redis://app:s3cr3t@" + closedPort(t), closedPort(t) + "," + closedPort(t)} {
		for _, args := range [][]string{{"inspect", path}, {"tail", path, "orders"}, {"produce", path, "orders"}} {
			args = append(args, "--redis", url)
			cmd := exec.Command(os.Args[0], "-test.run=^TestConnectionErrorIsTheOnlyLine$")
			cmd.Env = append(os.Environ(), env+"="+strings.Join(args, "\n"))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
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
