package runtime_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// service is a pipeline running as a service in the test's process.
type service struct {
	rt   *runtime.Runtime
	log  *syncBuffer
	out  *syncBuffer
	stop func()
}

// startService runs a plan as a service until the test ends (or stop is called), polling the streams
// often so that snapshots follow quickly.
func startService(t *testing.T, c *redis.Client, plan *flow.Plan, opts runtime.Options) *service {
	t.Helper()
	s := &service{log: &syncBuffer{}, out: &syncBuffer{}}
	opts.Redis = c
	opts.Logger = newLogger(s.log)
	if opts.Stdout == nil {
		opts.Stdout = s.out
	}
	if opts.Stdin == nil {
		opts.Stdin = strings.NewReader("")
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 20 * time.Millisecond
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 30 * time.Second
	}
	rt, err := runtime.New(plan, opts)
	if err != nil {
		t.Fatal(err)
	}
	s.rt = rt
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := rt.Run(ctx)
		done <- err
	}()
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v\n%s", err, s.log.String())
		}
	}
	t.Cleanup(s.stop)
	// The runtime sets its start time when Run begins, without a lock: a Snapshot taken before that
	// would race with it. The log line that follows the start orders the two (syncBuffer's mutex).
	waitFor(t, "the pipeline to start", func() bool { return strings.Contains(s.log.String(), "pipeline starting") })
	return s
}

// get requests a path from the handler and returns the status and body.
func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, string(body)
}

const passThrough = `
pipeline "web" {}
topic "in" { partitions = 2 }
stage "pass" {
  kind  = "filter"
  input = topic.in
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.pass
}
`

func TestHTTPHealthAndReadiness(t *testing.T) {
	c := server.open(t)
	plan := buildSource(t, passThrough)
	rt, err := runtime.New(plan, runtime.Options{Redis: c})
	if err != nil {
		t.Fatal(err)
	}
	h := runtime.NewHTTPHandler(rt, nil)
	if code, body := get(t, h, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "has not started") {
		t.Errorf("/readyz before the run: %d %q", code, body)
	}
	if code, body := get(t, h, "/metrics"); code != http.StatusNotFound || strings.Count(body, "\n") != 1 || !strings.Contains(body, "metrics") {
		t.Errorf("/metrics without a handler: %d %q", code, body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/readyz", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /readyz: %d", rec.Code)
	}

	s := startService(t, c, buildSource(t, passThrough), runtime.Options{})
	h = runtime.NewHTTPHandler(s.rt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "flowrun_messages_total 0\n")
	}))
	waitFor(t, "/readyz to answer 200", func() bool {
		code, body := get(t, h, "/readyz")
		return code == http.StatusOK && body == "ready\n"
	})
	if code, body := get(t, h, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz while running: %d %q", code, body)
	}
	if code, body := get(t, h, "/metrics"); code != http.StatusOK || body != "flowrun_messages_total 0\n" {
		t.Errorf("/metrics is not delegated: %d %q", code, body)
	}
}
