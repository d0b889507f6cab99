package stages

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
)

// fakeLimiter is a RateLimiter of the tests: the limit of each key lets n messages go, then says
// to wait.
type fakeLimiter struct {
	left  map[string]int
	asked []string
	limit RateLimit
}

func (f *fakeLimiter) Take(_ context.Context, key string, l RateLimit) (time.Duration, error) {
	f.asked, f.limit = append(f.asked, key), l
	if f.left[key] <= 0 {
		return 7 * time.Millisecond, nil
	}
	f.left[key]--
	return 0, nil
}

const rateLimitSrc = `
stage "limit" {
  kind   = "rate_limit"
  input  = topic.in
  output = topic.a
  key    = msg.tenant
  rate   = 100
  per    = "2s"
  burst  = 3
}
` + sinkA

// A message within its key's limit goes on unchanged; one over it is delayed (stages.Delay), not
// dropped; each key is asked for by its own value.
func TestRateLimitPassesOrDelays(t *testing.T) {
	p := plan(t, rateLimitSrc)
	lim := &fakeLimiter{left: map[string]int{"acme": 1}}
	proc, err := Compile(p.Stage("limit"), Env{RateLimiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	outs, err := process(t, proc, `{"tenant":"acme","n":1}`)
	if err != nil || len(outs) != 1 || payloadOf(t, outs[0]) != `{"tenant":"acme","n":1}` || outs[0].Message.Key != "k" {
		t.Fatalf("within the limit: %v %+v, want the message unchanged", err, outs)
	}
	outs, err = process(t, proc, `{"tenant":"acme","n":2}`)
	if d, ok := DelayOf(err); !ok || d != 7*time.Millisecond || len(outs) != 0 {
		t.Fatalf("over the limit: %v %+v, want a delay of 7ms and no output", err, outs)
	}
	if IsPermanent(err) || IsTransient(err) {
		t.Errorf("a delay is neither permanent nor transient: %v", err)
	}
	if strings.Join(lim.asked, ",") != "acme,acme" {
		t.Errorf("asked for %v", lim.asked)
	}
	if want := (RateLimit{Interval: 20 * time.Millisecond, Burst: 3}); lim.limit != want {
		t.Errorf("the limit is %+v, want %+v (2s / 100, burst 3)", lim.limit, want)
	}
	_, err = process(t, proc, `{"n":3}`)
	if !IsPermanent(err) {
		t.Errorf("a message without the key: %v, want a permanent error", err)
	}
	if _, err := Compile(p.Stage("limit"), Env{}); err == nil {
		t.Error("a rate_limit stage compiled without a rate limiter")
	}
}

// Without a key every message shares one limit; per and burst default to 1s and 1.
func TestRateLimitWithoutKey(t *testing.T) {
	p := plan(t, `
stage "limit" {
  kind   = "rate_limit"
  input  = topic.in
  output = topic.a
  rate   = 4
}
`+sinkA)
	lim := &fakeLimiter{left: map[string]int{"": 5}}
	proc, err := Compile(p.Stage("limit"), Env{RateLimiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := process(t, proc, `{"tenant":"acme"}`); err != nil {
		t.Fatal(err)
	}
	if len(lim.asked) != 1 || lim.asked[0] != "" || lim.limit != (RateLimit{Interval: 250 * time.Millisecond, Burst: 1}) {
		t.Errorf("asked %q for %+v, want \"\" and 250ms, burst 1", lim.asked, lim.limit)
	}
}

// Wrong attributes are refused at the attribute.
func TestRateLimitChecks(t *testing.T) {
	for _, tc := range []struct{ attrs, want, at string }{
		{"rate = 0", "greater than 0", "0"},
		{"rate = -5", "greater than 0", "-5"},
		{"rate = 10\n  per = \"0s\"", "positive duration", `"0s"`},
		{"rate = 2000000\n  per = \"1s\"", "more than one message a microsecond", "2000000"},
		{"rate = 10\n  burst = 0", "", "0"},
		{"rate = 10\n  per = \"soon\"", "", `"soon"`},
		{"per = \"1s\"", "rate", ""},
		{"rate = 10\n  key = upper(msg.tenant)\n  burst = 1.5", "", "1.5"},
		{"rate = 10\n  ordering = \"none\"", "not \"none\"", `"none"`},
	} {
		src := `
pipeline "t" {}
topic "in" {}
topic "out" {}
source "s" {
  kind   = "stdin"
  output = topic.in
}
sink "out" {
  kind  = "stdout"
  input = topic.out
}
stage "limit" {
  kind   = "rate_limit"
  input  = topic.in
  output = topic.out
  ` + tc.attrs + `
}
`
		cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{})
		}
		if len(diags) != 1 || !strings.Contains(diags[0].Error(), tc.want) || diags[0].Subject == nil {
			t.Errorf("%q: %v, want one located error saying %q", tc.attrs, diags, tc.want)
			continue
		}
		r := diags[0].Subject
		if got := src[r.Start.Byte:r.End.Byte]; tc.at != "" && !strings.HasPrefix(got, tc.at) {
			t.Errorf("%q: the error is at %q, want %q", tc.attrs, got, tc.at)
		}
	}
}

// DelayOf finds a delay inside wrapping errors, and nothing in other errors.
func TestDelayOf(t *testing.T) {
	if d, ok := DelayOf(errors.Join(errors.New("x"), Delay(time.Second))); !ok || d != time.Second {
		t.Errorf("DelayOf(joined) = %s %v", d, ok)
	}
	if _, ok := DelayOf(errors.New("x")); ok {
		t.Error("a plain error is a delay")
	}
	if d, _ := DelayOf(Delay(-time.Second)); d <= 0 {
		t.Errorf("a negative delay became %s, want a positive one", d)
	}
}

// An http sink's rate_limit block limits its requests as the stage does: a message over the limit
// is delayed before any request is made.
func TestHTTPSinkRateLimit(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { requests.Add(1) }))
	defer srv.Close()
	src := `
pipeline "t" {}
topic "in" {}
source "s" {
  kind   = "stdin"
  output = topic.in
}
sink "hook" {
  kind  = "http"
  input = topic.in
  url   = "` + srv.URL + `"
  rate_limit {
    key   = msg.tenant
    rate  = 5
    per   = "1m"
    burst = 2
  }
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
	kind, err := SinkKindOf(p.Sinks[0])
	if err != nil {
		t.Fatal(err)
	}
	lim := &fakeLimiter{left: map[string]int{"acme": 1}}
	sink, err := kind.New(p.Sinks[0], Env{RateLimiter: lim, HTTPClient: srv.Client(), Clock: SystemClock{}, Redact: func(s string) string { return s }})
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(payload string) error {
		m := NewMessage("k", []byte(payload), nil)
		_, err := sink.Deliver(context.Background(), &m, nil)
		return err
	}
	if err := deliver(`{"tenant":"acme"}`); err != nil || requests.Load() != 1 {
		t.Fatalf("within the limit: %v, %d requests", err, requests.Load())
	}
	if d, ok := DelayOf(deliver(`{"tenant":"acme"}`)); !ok || d <= 0 || requests.Load() != 1 {
		t.Fatalf("over the limit: delay %s %v, %d requests; want a delay and no request", d, ok, requests.Load())
	}
	if want := (RateLimit{Interval: 12 * time.Second, Burst: 2}); lim.limit != want {
		t.Errorf("the limit is %+v, want %+v", lim.limit, want)
	}
	if _, err := kind.New(p.Sinks[0], Env{HTTPClient: srv.Client()}); err == nil {
		t.Error("an http sink with a rate_limit block was made without a rate limiter")
	}

	bad := strings.Replace(src, "rate  = 5", "rate  = 0", 1)
	cfg, diags = flow.LoadSource(map[string][]byte{"t.hcl": []byte(bad)})
	if !diags.HasErrors() {
		_, diags = flow.Compile(cfg, flow.Options{})
	}
	if len(diags) != 1 || !strings.Contains(diags[0].Detail, "greater than 0") || diags[0].Subject == nil || diags[0].Subject.Start.Line != 14 {
		t.Errorf("rate = 0 in the block: %v, want one error at line 14", diags)
	}
}
