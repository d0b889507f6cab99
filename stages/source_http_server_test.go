package stages

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/flowrun/flowrun/flow"
)

// httpServerFor compiles an http_server source with the given attributes and returns it with a
// test server that runs its handler into out.
func httpServerFor(t *testing.T, attrs string, out Emitter) *httptest.Server {
	t.Helper()
	src := `
pipeline "t" {}
topic "events" {}
source "webhooks" {
  kind   = "http_server"
  output = topic.events
  path   = "/events"
` + attrs + `
}
sink "out" {
  kind  = "stdout"
  input = topic.events
}
`
	cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, diags := flow.Compile(cfg, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	s, err := newHTTPServerSource(p.Sources[0].Config, Env{Node: "webhooks", MaxMessageSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.handler(out))
	t.Cleanup(srv.Close)
	return srv
}

// groupEmitter is an Emitter that records what EmitAll gets and answers with err, or with an ID per
// message.
type groupEmitter struct {
	mu     sync.Mutex
	calls  [][]Message
	at     [][]Origin
	trace  []string
	err    error
	block  chan struct{} // when set, EmitAll waits for it to close
	inside chan struct{} // when set, told when EmitAll is entered
}

func (e *groupEmitter) EmitAll(ctx context.Context, ms []Message, at []Origin) ([]string, error) {
	if e.inside != nil {
		e.inside <- struct{}{}
	}
	if e.block != nil {
		<-e.block
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	parent, _ := TraceFrom(ctx)
	e.calls, e.at, e.trace = append(e.calls, ms), append(e.at, at), append(e.trace, parent)
	if e.err != nil {
		return nil, e.err
	}
	ids := make([]string, len(ms))
	for i := range ms {
		ids[i] = fmt.Sprintf("1-%d", i)
	}
	return ids, nil
}

func (e *groupEmitter) Emit(context.Context, Message, Origin) error { panic("not used") }
func (e *groupEmitter) Reject(context.Context, error, Message, Origin) error {
	panic("not used")
}
func (e *groupEmitter) Resume(context.Context) (string, bool, error) { return "", false, nil }
func (e *groupEmitter) ReportLag(int64)                              {}
func (e *groupEmitter) Record(context.Context, string) error         { return nil }

// post sends a request and returns its status, its body and its response headers.
func post(t *testing.T, url, contentType, body string, headers ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func payloads(t *testing.T, ms []Message) []string {
	t.Helper()
	out := make([]string, len(ms))
	for i := range ms {
		p, err := ms[i].Payload()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = string(p)
	}
	return out
}

func TestHTTPServerFramings(t *testing.T) {
	cases := []struct {
		name, attrs, contentType, body string
		want                           []string
	}{
		{"auto single object", "", "application/json", ` {"a":1} `, []string{`{"a":1}`}},
		{"auto json array", "", "application/json; charset=utf-8", ` [{"a":1}, {"b":[1,"]"]} ,{"c":"}\""}]`, []string{`{"a":1}`, `{"b":[1,"]"]}`, `{"c":"}\""}`}},
		{"auto ndjson", "", "application/x-ndjson", "{\"a\":1}\n\n  {\"b\":2}\r\n", []string{`{"a":1}`, `{"b":2}`}},
		{"auto jsonl", "", "application/jsonl", "{\"a\":1}", []string{`{"a":1}`}},
		{"ndjson whatever the json type", `framing = "ndjson"`, "application/json", "{\"a\":1}\n{\"b\":2}", []string{`{"a":1}`, `{"b":2}`}},
		{"explicit framing without a type", `framing = "json_array"`, "", `[{"a":1}]`, []string{`{"a":1}`}},
		{"single keeps an array-looking framing out", `framing = "single"`, "application/json", `{"a":[1]}`, []string{`{"a":[1]}`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &groupEmitter{}
			srv := httpServerFor(t, c.attrs, e)
			status, body, _ := post(t, srv.URL+"/events", c.contentType, c.body)
			if status != http.StatusAccepted {
				t.Fatalf("status %d: %s", status, body)
			}
			var got struct{ IDs []string }
			if err := json.Unmarshal([]byte(body), &got); err != nil || len(got.IDs) != len(c.want) {
				t.Fatalf("answer %s (%v), want %d ids", body, err, len(c.want))
			}
			if len(e.calls) != 1 {
				t.Fatalf("%d EmitAll calls, want 1", len(e.calls))
			}
			if got := payloads(t, e.calls[0]); strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Errorf("payloads %q, want %q", got, c.want)
			}
		})
	}
}

func TestHTTPServerIdempotencyKeyNamesMessages(t *testing.T) {
	e := &groupEmitter{}
	srv := httpServerFor(t, "", e)
	for range 2 {
		if status, body, _ := post(t, srv.URL+"/events", "application/x-ndjson", "{\"a\":1}\n{\"a\":2}", "Idempotency-Key", "req-7"); status != http.StatusAccepted {
			t.Fatalf("status %d: %s", status, body)
		}
	}
	if status, body, _ := post(t, srv.URL+"/events", "application/json", `{"a":3}`); status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	if status, body, _ := post(t, srv.URL+"/events", "application/json", `{"a":3}`); status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	for i, want := range []string{"k:req-7:0", "k:req-7:1"} {
		if e.at[0][i].ID != want || e.at[1][i].ID != want {
			t.Errorf("message %d: IDs %q and %q, want %q both times", i, e.at[0][i].ID, e.at[1][i].ID, want)
		}
	}
	if e.at[0][1].Line != 2 {
		t.Errorf("the second line's origin says line %d", e.at[0][1].Line)
	}
	if a, b := e.at[2][0].ID, e.at[3][0].ID; a == b || !strings.HasPrefix(a, "r:") {
		t.Errorf("requests without a key are named %q and %q: want distinct names", a, b)
	}
}

func TestHTTPServerRefusals(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	cases := []struct {
		name, attrs, method, path, contentType, body string
		headers                                      []string
		err                                          error // what EmitAll answers
		status                                       int
		says                                         string
		retryAfter                                   bool
	}{
		{name: "no token", attrs: `auth_token = "s3cret"`, status: 401, says: "Bearer"},
		{name: "wrong token", attrs: `auth_token = "s3cret"`, headers: []string{"Authorization", "Bearer s3cre"}, status: 401},
		{name: "unknown type", contentType: "text/plain", status: 415, says: "text/plain"},
		{name: "no type with auto", contentType: "-", status: 415},
		{name: "compressed", headers: []string{"Content-Encoding", "gzip"}, status: 415, says: "gzip"},
		{name: "over max_body", attrs: `max_body = "16B"`, body: `{"a":"0123456789abcdef"}`, status: 413, says: "max_body"},
		{name: "too many messages", attrs: `max_messages = 2`, contentType: "application/x-ndjson", body: "{}\n{}\n{}", status: 413, says: "max_messages"},
		{name: "invalid line", contentType: "application/x-ndjson", body: "{\"a\":1}\n\n{\"a\":\n{}", status: 400, says: "line 3: payload is not valid JSON"},
		{name: "not an object", contentType: "application/x-ndjson", body: "{}\n[1]", status: 400, says: "line 2: payload is a JSON array, not an object"},
		{name: "bad element", body: `[{}, 5]`, status: 400, says: "element 2 of the array: payload is a JSON number"},
		{name: "open array", body: `[{}, {}`, status: 400, says: "not closed"},
		{name: "data after the array", body: `[{}] {}`, status: 400, says: "after its JSON array"},
		{name: "deep JSON", body: deep, status: 400, says: "nested deeper than"},
		{name: "deep JSON in an array", body: "[" + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + "]", status: 400, says: "element 1 of the array"},
		{name: "invalid UTF-8", body: "{\"a\":\"\xff\"}", status: 400, says: "not valid UTF-8"},
		{name: "empty body", body: " ", status: 400, says: "no message"},
		{name: "bad idempotency key", headers: []string{"Idempotency-Key", "a b"}, status: 400, says: "Idempotency-Key"},
		{name: "other path", path: "/other", status: 404},
		{name: "GET", method: http.MethodGet, status: 405},
		{name: "message refused", err: &EmitError{Index: 0, Err: Permanent(errors.New("too big"))}, status: 400, says: "the body: too big"},
		{name: "topic full", err: ErrTopicFull, status: 429, says: "max_lag", retryAfter: true},
		{name: "Redis failing", err: ErrUnavailable, status: 503, says: "Idempotency-Key", retryAfter: true},
		{name: "Redis too slow", err: context.DeadlineExceeded, status: 503, retryAfter: true},
		{name: "broken", err: errors.New("boom"), status: 500, says: "nothing was written"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &groupEmitter{err: c.err}
			srv := httpServerFor(t, c.attrs, e)
			method, path, ct, body := c.method, c.path, c.contentType, c.body
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = "/events"
			}
			switch ct {
			case "":
				ct = "application/json"
			case "-":
				ct = ""
			}
			if body == "" {
				body = `{"a":1}`
			}
			req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			for i := 0; i+1 < len(c.headers); i += 2 {
				req.Header.Set(c.headers[i], c.headers[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != c.status || !strings.Contains(string(b), c.says) {
				t.Errorf("answer %d %s, want %d saying %q", resp.StatusCode, b, c.status, c.says)
			}
			if got := resp.Header.Get("Retry-After") != ""; got != c.retryAfter {
				t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
			}
			if c.err == nil && len(e.calls) > 0 {
				t.Errorf("a refused request was passed on: %d calls", len(e.calls))
			}
		})
	}
}

func TestHTTPServerAcceptsTheToken(t *testing.T) {
	e := &groupEmitter{}
	srv := httpServerFor(t, `auth_token = "s3cret"`, e)
	if status, body, _ := post(t, srv.URL+"/events", "application/json", `{}`, "Authorization", "Bearer s3cret"); status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
}

// A body announced as huge is refused before it is read.
func TestHTTPServerRefusesAHugeContentLength(t *testing.T) {
	e := &groupEmitter{}
	srv := httpServerFor(t, "", e)
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/events", pr)
	req.ContentLength = 2 << 30
	req.Header.Set("Content-Type", "application/json")
	go func() { _, _ = pw.Write([]byte(`{"a":`)) }()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || len(e.calls) > 0 {
		t.Errorf("status %d, %d calls", resp.StatusCode, len(e.calls))
	}
}

func TestHTTPServerCarriesTheTraceparent(t *testing.T) {
	e := &groupEmitter{}
	srv := httpServerFor(t, "", e)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if status, body, _ := post(t, srv.URL+"/events", "application/json", `{}`, "traceparent", tp); status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	if e.trace[0] != tp {
		t.Errorf("EmitAll's context carries %q", e.trace[0])
	}
}

func TestHTTPServerLimitsRequestsAtOnce(t *testing.T) {
	e := &groupEmitter{block: make(chan struct{}), inside: make(chan struct{}, 1)}
	srv := httpServerFor(t, `max_requests = 1`, e)
	first := make(chan int)
	go func() {
		status, _, _ := post(t, srv.URL+"/events", "application/json", `{}`)
		first <- status
	}()
	<-e.inside
	status, body, h := post(t, srv.URL+"/events", "application/json", `{}`)
	if status != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Errorf("a second request at once: %d %s", status, body)
	}
	close(e.block)
	if status := <-first; status != http.StatusAccepted {
		t.Errorf("the first request: %d", status)
	}
}

func TestHTTPServerChecksItsAttributes(t *testing.T) {
	for attrs, want := range map[string]string{
		`address = "nohost:port:x"`: "Invalid address",
		`auth_token = ""`:           "Empty auth_token",
		`framing = "xml"`:           "framing",
	} {
		src := `
pipeline "t" {}
topic "events" {}
source "webhooks" {
  kind   = "http_server"
  output = topic.events
  ` + attrs + `
}
sink "out" {
  kind  = "stdout"
  input = topic.events
}
`
		cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{})
		}
		if !diags.HasErrors() || !strings.Contains(diags.Error(), want) {
			t.Errorf("%s: diagnostics %v, want %q", attrs, diags, want)
		}
	}
	for in, want := range map[string]string{"8080": "127.0.0.1:8080", ":8080": "127.0.0.1:8080", "0.0.0.0:80": "0.0.0.0:80", "[::1]:80": "[::1]:80"} {
		if got := httpServerAddress(in); got != want {
			t.Errorf("address %q listens on %q, want %q", in, got, want)
		}
	}
}
