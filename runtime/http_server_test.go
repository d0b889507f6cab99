package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The http_server source answers a request once Redis has all of its messages, and writes a request
// whole or not at all: these tests post to it on a real redis-server and read the topic's streams.

// freeAddr returns a loopback address that nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// postAccepted posts a request to an http_server source as a well-behaved client does: a 429 or a
// 503 (the topic over its max_lag, Redis slow or away) is sent again after its Retry-After, with
// the same Idempotency-Key, until it is answered 202; any other answer fails the test. It returns
// the body of the 202.
func postAccepted(t *testing.T, url, contentType, body, key, token string) []byte {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+token)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusAccepted:
			return b
		case (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) && time.Now().Before(deadline):
			wait, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || wait < 1 {
				wait = 1
			}
			time.Sleep(time.Duration(min(wait, 2)) * time.Second) // the protocol's back-off, as a client's
		default:
			t.Fatalf("%s request: %d %s", contentType, resp.StatusCode, b)
		}
	}
}

// webhooksPipeline is an http_server source into a keyed topic of 4 partitions (with extra
// attributes), which a stdout sink reads, or the sink block given.
func webhooksPipeline(addr, delivery, extra string, sink ...string) string {
	out := `
sink "out" {
  kind  = "stdout"
  input = topic.events
}`
	if len(sink) > 0 {
		out = sink[0]
	}
	return fmt.Sprintf(`
pipeline "webhooks" {
  delivery = %q
}
topic "events" {
  partitions = 4
  key        = msg.k
  %s
}
source "hooks" {
  kind    = "http_server"
  output  = topic.events
  address = %q
  path    = "/events"
}
%s
`, delivery, extra, addr, out)
}

// hookRequest posts n messages {"req": req, "i": 0..n-1, "k": ...} as JSON lines, with an
// idempotency key when key is set, and returns the status and the answer's IDs.
func hookRequest(t *testing.T, url, req string, n int, key string) (int, []string, http.Header) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"req":%q,"i":%d,"k":"k%d"}`+"\n", req, i, i%7)
	}
	return postHook(t, url, "application/x-ndjson", b.String(), key)
}

func postHook(t *testing.T, url, contentType, body, key string) (int, []string, http.Header) {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", contentType)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	var answer struct {
		IDs   []string `json:"ids"`
		Error string   `json:"error"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		t.Fatalf("answer %d %q: %v", resp.StatusCode, raw, err)
	}
	if resp.StatusCode == http.StatusAccepted && len(answer.IDs) == 0 {
		t.Fatalf("202 without IDs: %s", raw)
	}
	return resp.StatusCode, answer.IDs, resp.Header
}

// topicEntries returns, per request name, how many times each message number is in the topic, and
// the stream IDs of the entries (partitions may share an ID).
func topicEntries(t *testing.T, c *redis.Client, plan *flow.Plan, topic string) (map[string]map[int]int, map[string]bool) {
	t.Helper()
	got, ids := map[string]map[int]int{}, map[string]bool{}
	for _, stream := range (redis.Keys{Prefix: plan.KeyPrefix}).Streams(topic, 4) {
		after := "0"
		for {
			recs, err := c.Read(context.Background(), stream, after, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				break
			}
			for _, r := range recs {
				m := jsonObject(t, string(r.Payload))
				req := m["req"].(string)
				if got[req] == nil {
					got[req] = map[int]int{}
				}
				got[req][int(m["i"].(float64))]++
				ids[r.ID] = true
				after = r.ID
			}
		}
	}
	return got, ids
}

// wholeOnce checks that a request's n messages are each in the topic times times.
func wholeOnce(t *testing.T, got map[string]map[int]int, req string, n, times int) {
	t.Helper()
	if len(got[req]) != n {
		t.Errorf("request %s: %d of its %d messages are in the topic", req, len(got[req]), n)
	}
	for i, k := range got[req] {
		if k != times {
			t.Errorf("request %s: message %d is in the topic %d times, want %d", req, i, k, times)
		}
	}
}

func TestHTTPServerSourceWritesWholeRequests(t *testing.T) {
	c := server.open(t)
	addr := freeAddr(t)
	plan := buildSource(t, webhooksPipeline(addr, "at_least_once", ""))
	svc := startService(t, c, plan, runtime.Options{})
	url := "http://" + addr + "/events"
	waitFor(t, "the source to listen", func() bool { return strings.Contains(svc.log.String(), "taking messages over HTTP") })

	sizes := []int{1, 2, 37, 500, 1, 1500} // 1500: more than a writer's batch, still one transaction
	answered := map[string]bool{}
	for r, n := range sizes {
		status, ids, _ := hookRequest(t, url, fmt.Sprintf("r%d", r), n, "")
		if status != http.StatusAccepted || len(ids) != n {
			t.Fatalf("request %d of %d messages: %d with %d IDs", r, n, status, len(ids))
		}
		for _, id := range ids {
			answered[id] = true
		}
	}
	// An array and a single object, by Content-Type.
	if status, ids, _ := postHook(t, url, "application/json", `[{"req":"arr","i":0,"k":"a"},{"req":"arr","i":1,"k":"b"}]`, ""); status != http.StatusAccepted || len(ids) != 2 {
		t.Fatalf("an array: %d, %d IDs", status, len(ids))
	}
	if status, ids, _ := postHook(t, url, "application/json", `{"req":"one","i":0,"k":"a"}`, ""); status != http.StatusAccepted || len(ids) != 1 {
		t.Fatalf("an object: %d, %d IDs", status, len(ids))
	}
	// A request with an invalid line writes nothing, and says which line.
	bad := "{\"req\":\"bad\",\"i\":0,\"k\":\"a\"}\n{\"req\":\"bad\",\"i\":1,\n"
	if status, _, _ := postHook(t, url, "application/x-ndjson", bad, ""); status != http.StatusBadRequest {
		t.Fatalf("an invalid line: %d, want 400", status)
	}

	got, ids := topicEntries(t, c, plan, "events")
	for r, n := range sizes {
		wholeOnce(t, got, fmt.Sprintf("r%d", r), n, 1)
	}
	wholeOnce(t, got, "arr", 2, 1)
	wholeOnce(t, got, "one", 1, 1)
	if len(got["bad"]) != 0 {
		t.Errorf("the refused request wrote %d messages", len(got["bad"]))
	}
	for id := range answered {
		if !ids[id] {
			t.Errorf("the answer named entry %s, which the topic does not have", id)
		}
	}
	entries := 0
	for _, byI := range got {
		for _, k := range byI {
			entries += k
		}
	}
	if src := svc.rt.Snapshot().Sources[0]; src.Produced != int64(entries) {
		t.Errorf("the source counted %d messages produced, the topic has %d", src.Produced, entries)
	}

	// A stop closes the listener.
	svc.stop()
	if _, err := http.Post(url, "application/json", strings.NewReader(`{}`)); err == nil {
		t.Errorf("the source still takes requests after the pipeline stopped")
	}
}

// A request sent again with the same idempotency key is written once with effectively-once delivery
// (and gets the IDs of the first write), twice with at-least-once.
func TestHTTPServerSourceRetryWithTheSameKey(t *testing.T) {
	for _, c := range []struct {
		delivery string
		times    int
	}{{"effectively_once", 1}, {"at_least_once", 2}} {
		t.Run(c.delivery, func(t *testing.T) {
			rc := server.open(t)
			addr := freeAddr(t)
			plan := buildSource(t, webhooksPipeline(addr, c.delivery, ""))
			svc := startService(t, rc, plan, runtime.Options{})
			url := "http://" + addr + "/events"
			waitFor(t, "the source to listen", func() bool { return strings.Contains(svc.log.String(), "taking messages over HTTP") })
			_, first, _ := hookRequest(t, url, "once", 50, "key-1")
			status, again, _ := hookRequest(t, url, "once", 50, "key-1")
			if status != http.StatusAccepted {
				t.Fatalf("the repeated request: %d", status)
			}
			if c.times == 1 && strings.Join(first, ",") != strings.Join(again, ",") {
				t.Errorf("the repeated request's IDs differ from the first's:\n%v\n%v", first, again)
			}
			got, _ := topicEntries(t, rc, plan, "events")
			wholeOnce(t, got, "once", 50, c.times)
		})
	}
}

// While Redis is down a request is refused with 503 and Retry-After; what lands of it when Redis is
// back is all of it or nothing, and its retry with the same key is written once.
func TestHTTPServerSourceRefusesWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF())
	c := openURLs(t, srv.URL())
	addr := freeAddr(t)
	plan := buildSource(t, webhooksPipeline(addr, "effectively_once", ""))
	svc := startService(t, c, plan, runtime.Options{})
	url := "http://" + addr + "/events"
	waitFor(t, "the source to listen", func() bool { return strings.Contains(svc.log.String(), "taking messages over HTTP") })
	if status, _, _ := hookRequest(t, url, "before", 20, "before"); status != http.StatusAccepted {
		t.Fatalf("before the outage: %d", status)
	}

	srv.Stop()
	const n = 300
	refused := 0
	for r := range 3 { // the first finds out that Redis is down, the others are refused at once
		status, _, h := hookRequest(t, url, fmt.Sprintf("down%d", r), n, fmt.Sprintf("down%d", r))
		if status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
			t.Errorf("request %d while Redis is down: %d (Retry-After %q), want 503 with Retry-After", r, status, h.Get("Retry-After"))
		}
		refused++
	}
	srv.Start(t)
	for r := range refused { // the clients try again, with their keys
		waitFor(t, "a retry to be taken", func() bool {
			status, _, _ := hookRequest(t, url, fmt.Sprintf("down%d", r), n, fmt.Sprintf("down%d", r))
			return status == http.StatusAccepted
		})
	}
	got, _ := topicEntries(t, c, plan, "events")
	wholeOnce(t, got, "before", 20, 1)
	for r := range refused {
		wholeOnce(t, got, fmt.Sprintf("down%d", r), n, 1)
	}
}

// A topic at its max_lag refuses requests with 429 and Retry-After, and writes nothing of them.
func TestHTTPServerSourceRefusesWhileTheTopicIsFull(t *testing.T) {
	c := server.open(t)
	addr := freeAddr(t)
	plan := buildSource(t, webhooksPipeline(addr, "at_least_once", "max_lag = 10", fmt.Sprintf(`
sink "out" {
  kind  = "http"
  input = topic.events
  url   = "http://%s/nobody-listens"
}`, freeAddr(t))))
	svc := startService(t, c, plan, runtime.Options{})
	url := "http://" + addr + "/events"
	waitFor(t, "the source to listen", func() bool { return strings.Contains(svc.log.String(), "taking messages over HTTP") })
	// The sink cannot deliver (nothing listens at its URL): the first request fills the topic.
	if status, _, _ := hookRequest(t, url, "fills", 40, ""); status != http.StatusAccepted {
		t.Fatalf("the first request: %d", status)
	}
	status, _, h := hookRequest(t, url, "refused", 5, "")
	if status != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Errorf("a request while the topic is full: %d (Retry-After %q), want 429 with Retry-After", status, h.Get("Retry-After"))
	}
	got, _ := topicEntries(t, c, plan, "events")
	wholeOnce(t, got, "fills", 40, 1)
	if len(got["refused"]) != 0 {
		t.Errorf("the refused request wrote %d messages", len(got["refused"]))
	}
}

// A request's traceparent starts its messages' traces: each message's send span is a child of the
// caller's span, and the sink's span continues the same trace. Without one, each message starts a
// trace of its own.
func TestHTTPServerSourceContinuesTheCallersTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c := server.open(t)
	addr := freeAddr(t)
	plan := buildSource(t, webhooksPipeline(addr, "at_least_once", ""))
	svc := startService(t, c, plan, runtime.Options{TracerProvider: tp})
	url := "http://" + addr + "/events"
	waitFor(t, "the source to listen", func() bool { return strings.Contains(svc.log.String(), "taking messages over HTTP") })

	const traceID, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("{\"req\":\"traced\",\"i\":0,\"k\":\"a\"}\n{\"req\":\"traced\",\"i\":1,\"k\":\"b\"}"))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d", resp.StatusCode)
	}
	waitFor(t, "the sink's spans", func() bool {
		n := 0
		for _, s := range rec.Ended() {
			if s.Name() == "process events" && s.SpanContext().TraceID().String() == traceID {
				n++
			}
		}
		return n == 2
	})
	sends := 0
	for _, s := range rec.Ended() {
		if s.Name() != "send events" {
			continue
		}
		sends++
		if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != callerSpan || !s.Parent().IsRemote() {
			t.Errorf("a send span in trace %s with parent %s, want trace %s under the caller's span %s",
				s.SpanContext().TraceID(), s.Parent().SpanID(), traceID, callerSpan)
		}
	}
	if sends != 2 {
		t.Errorf("%d send spans, want 2", sends)
	}
}
