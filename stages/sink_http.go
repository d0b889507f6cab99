package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/flow"
)

// The http sink's attributes.
const (
	httpSinkFieldURL     = "url"
	httpSinkFieldMethod  = "method"
	httpSinkFieldHeaders = "headers"
	httpSinkFieldTimeout = "timeout"
	httpSinkBlockLimit   = "rate_limit"
)

// httpRateLimitSpec is the http sink's rate_limit block: the rate_limit stage's limit, on the
// sink's requests.
var httpRateLimitSpec = &flow.BlockSpec{
	Type: httpSinkBlockLimit,
	Doc: "Limits the sink's requests per key, across every process that runs the pipeline, as a rate_limit stage does: " +
		"a message over the limit waits where it is for its turn, and is never dropped.",
	Attributes: rateLimitAttributes("requests"),
}

// The http sink sends each message as a JSON request body. 2xx is success; 408, 429, 5xx and
// network errors are transient (the sink pauses until the service is back); any other status fails
// the message for good.
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "http",
			Doc: "Sends each message as a JSON request body. 2xx is success; 408, 429 and 5xx are retried; " +
				"other 4xx fail for good.",
			Attributes: []flow.Attribute{
				{Name: httpSinkFieldURL, Type: flow.TypeString, Required: true, Doc: "The URL to send to."},
				{
					Name: httpSinkFieldMethod, Type: flow.TypeString, Default: "POST",
					Enum: []string{"POST", "PUT", "PATCH"}, Doc: "The request method.",
				},
				{Name: httpSinkFieldHeaders, Type: flow.TypeStringMap, Doc: "Request headers, such as { Authorization = \"Bearer ${var.token}\" }."},
				{Name: httpSinkFieldTimeout, Type: flow.TypeDuration, Default: 10 * time.Second, Doc: "How long one request may take."},
			},
			Blocks: []flow.NestedBlock{{Spec: httpRateLimitSpec, Max: 1}},
			Example: `sink "webhook" {
  kind    = "http"
  input   = topic.alerts
  url     = var.webhook_url
  headers = { Authorization = "Bearer ${var.webhook_token}" }
}`,
			Check: func(c *flow.KindCheck) {
				for _, l := range c.Config.Blocks(httpSinkBlockLimit) {
					checkLimit(l, func(attribute, summary, format string, args ...any) {
						c.BlockErrorf(httpSinkBlockLimit, attribute, summary, format, args...)
					})
				}
			},
		},
		Traits: SinkTraits{Lanes: 8},
		New: func(s *flow.Sink, env Env) (Sink, error) {
			sink := &httpSink{
				client: env.HTTPClient, clock: env.Clock, redact: env.Redact,
				url: s.Config.String(httpSinkFieldURL), method: s.Config.String(httpSinkFieldMethod),
				headers: s.Config.StringMap(httpSinkFieldHeaders), timeout: s.Config.Duration(httpSinkFieldTimeout),
			}
			if limits := s.Config.Blocks(httpSinkBlockLimit); len(limits) > 0 {
				if env.RateLimiter == nil {
					return nil, fmt.Errorf("sink %s: a rate_limit block needs the runtime's rate limits (Env.RateLimiter), which this runtime does not offer", s.Name)
				}
				l := newKeyedLimit(limits[0], env.RateLimiter)
				sink.limit = &l
			}
			return sink, nil
		},
	})
}

type httpSink struct {
	client  *http.Client
	clock   Clock
	url     string
	method  string
	headers map[string]string
	timeout time.Duration
	redact  func(string) string // hides secrets (a token in the URL) in errors
	limit   *keyedLimit         // the rate_limit block's; nil without one
}

func (s *httpSink) Timeout() time.Duration { return s.timeout }

func (s *httpSink) Deliver(ctx context.Context, m *Message, out []Write) ([]Write, error) {
	if s.limit != nil {
		if err := s.limit.take(ctx, m); err != nil {
			return out, err // a Delay: the runtime waits, and delivers it again
		}
	}
	payload, err := m.Payload()
	if err != nil {
		return out, err
	}
	req, err := http.NewRequestWithContext(ctx, s.method, s.url, bytes.NewReader(payload))
	if err != nil {
		return out, Permanent(errors.New(s.redact(err.Error())))
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range s.headers {
		req.Header.Set(k, v)
	}
	if parent, state := TraceFrom(ctx); parent != "" {
		req.Header.Set("traceparent", parent)
		if state != "" {
			req.Header.Set("tracestate", state)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// Redacted, as the URL may hold a secret, and kept transient when it was (connection refused,
		// a timeout, DNS): the sink then pauses until the service is back.
		if IsTransient(err) {
			return out, Transient(errors.New(s.redact(err.Error())))
		}
		return out, errors.New(s.redact(err.Error()))
	}
	// Read a little of the body, so that the connection can be reused and the error can say why.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close() // what the sink needs of the answer is read: the status and the start of the body
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return out, nil
	}
	err = errors.New(s.redact(fmt.Sprintf("%s %s: %s: %s", s.method, s.url, resp.Status, bytes.TrimSpace(body))))
	switch {
	case resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500:
		return out, TransientAfter(err, retryAfter(resp.Header.Get("Retry-After"), s.clock.Now()))
	}
	return out, Permanent(err)
}

// maxRetryAfter bounds what a service's Retry-After can make a sink wait.
const maxRetryAfter = 5 * time.Minute

// retryAfter reads an HTTP Retry-After header: seconds, or an HTTP date; 0 when absent or invalid.
func retryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if secs, err := strconv.Atoi(h); err == nil {
		return min(time.Duration(max(secs, 0))*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(h); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter)
	}
	return 0
}
