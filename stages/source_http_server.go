package stages

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/flowrun/flowrun/flow"
)

// The http_server source's attributes.
const (
	httpServerFieldAddress     = "address"
	httpServerFieldPath        = "path"
	httpServerFieldFraming     = "framing"
	httpServerFieldMaxBody     = "max_body"
	httpServerFieldMaxMessages = "max_messages"
	httpServerFieldMaxRequests = "max_requests"
	httpServerFieldAuthToken   = "auth_token"
	httpServerFieldTimeout     = "timeout"
	httpServerFieldReadTimeout = "read_timeout"
)

// The framings of a request body.
const (
	framingAuto      = "auto"
	framingSingle    = "single"
	framingNDJSON    = "ndjson"
	framingJSONArray = "json_array"
)

// IdempotencyKeyHeader is the request header that names a request for effectively-once delivery:
// its messages' IDs are the key and their index in the request, so that a request sent again with
// the same key is written once.
const IdempotencyKeyHeader = "Idempotency-Key"

// maxIdempotencyKey bounds an idempotency key's length, which goes into the Redis keys of the
// effectively-once markers.
const maxIdempotencyKey = 200

// httpServerRetryAfter is what a refusal that may pass (a full topic, Redis failing) asks the
// client to wait, in seconds: the time an outage of Redis takes to count as over.
const httpServerRetryAfter = "1"

// The http_server source listens for HTTP requests whose bodies carry messages, and answers each
// request once Redis has all of its messages (202, with their entries' IDs), or refuses it whole:
// the messages of a request are checked before any is passed on, and go to Redis together
// (Emitter.EmitAll), in one transaction on a single server. It never ends by itself; every process
// that runs the pipeline listens on its own address (Shared), as each has its own network.
//
// A stop (SIGTERM) closes the listener, lets the requests in flight finish, and then the source's
// writer drains as any source's does.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "http_server",
			Doc: "Listens for HTTP POST requests whose bodies are messages (one JSON object, JSON lines or a JSON array), " +
				"and answers 202 with the new entries' IDs once Redis has every message of the request: a request is written whole or not at all.",
			Attributes: []flow.Attribute{
				{
					Name: httpServerFieldAddress, Type: flow.TypeString, Default: "127.0.0.1:8080",
					Doc: "Where to listen, host:port. An address without a host (\":8080\" or \"8080\") listens on the loopback " +
						"interface only, as --http does; name a host (\"0.0.0.0:8080\") to listen on others.",
				},
				{Name: httpServerFieldPath, Type: flow.TypeString, Default: "/", Doc: "The URL path that takes messages; other paths answer 404."},
				{
					Name: httpServerFieldFraming, Type: flow.TypeString, Default: framingAuto,
					Enum: []string{framingAuto, framingSingle, framingNDJSON, framingJSONArray},
					Doc: "How a body holds messages: single (one JSON object), ndjson (one object per line), json_array (an array of " +
						"objects), or auto by the Content-Type: application/x-ndjson (or application/jsonl) is ndjson, application/json " +
						"an array when the body starts with [ and a single object otherwise. Other types answer 415.",
				},
				{Name: httpServerFieldMaxBody, Type: flow.TypeSize, Default: flow.Size(4 << 20), Min: flow.Bound(1), Doc: "The largest request body taken; larger ones answer 413."},
				{Name: httpServerFieldMaxMessages, Type: flow.TypeInteger, Default: int64(10000), Min: flow.Bound(1), Doc: "The most messages one request may carry; more answer 413."},
				{
					Name: httpServerFieldMaxRequests, Type: flow.TypeInteger, Default: int64(64), Min: flow.Bound(1),
					Doc: "How many requests are handled at once; more answer 429. With max_body it bounds the memory requests take.",
				},
				{
					Name: httpServerFieldAuthToken, Type: flow.TypeString,
					Doc: "When set, requests need the header Authorization: Bearer <token> (compared in constant time); others answer 401.",
				},
				{
					Name: httpServerFieldTimeout, Type: flow.TypeDuration, Default: 30 * time.Second, Min: flow.Bound(float64(time.Millisecond)),
					Doc: "How long a request waits for Redis to take its messages once it is read; then it answers 503 (its messages may still be written).",
				},
				{
					Name: httpServerFieldReadTimeout, Type: flow.TypeDuration, Default: 30 * time.Second, Min: flow.Bound(float64(time.Millisecond)),
					Doc: "How long a client may take to send a request, headers and body (headers: 10s at most); slower ones are cut off.",
				},
			},
			Check: checkHTTPServer,
			Example: `source "webhooks" {
  kind       = "http_server"
  output     = topic.events
  address    = "127.0.0.1:8080"
  path       = "/events"
  framing    = "auto"
  max_body   = "4MiB"
  auth_token = var.token
}`,
		},
		Traits: SourceTraits{Shared: true, Finite: func(flow.Attrs) (bool, int64) { return false, -1 }},
		New: func(s *flow.Source, env Env) (Source, error) {
			return newHTTPServerSource(s.Config, env)
		},
	})
}

func checkHTTPServer(c *flow.KindCheck) {
	if _, _, err := net.SplitHostPort(httpServerAddress(c.Config.String(httpServerFieldAddress))); err != nil {
		c.Errorf(httpServerFieldAddress, "Invalid address", "The address %q cannot be read: %s. Give host:port, such as \"127.0.0.1:8080\".",
			c.Config.String(httpServerFieldAddress), err)
	}
	if p := c.Config.String(httpServerFieldPath); !strings.HasPrefix(p, "/") {
		c.Errorf(httpServerFieldPath, "Invalid path", "A path begins with /, such as \"/events\".")
	}
	if c.Config.Has(httpServerFieldAuthToken) && c.Config.String(httpServerFieldAuthToken) == "" { // null: unset
		c.Errorf(httpServerFieldAuthToken, "Empty auth_token", "An empty token would let anyone in; leave auth_token out (or null) to take requests without one.")
	}
}

// httpServerAddress completes an address as --http does: without a host it is the loopback's.
func httpServerAddress(addr string) string {
	if !strings.Contains(addr, ":") {
		return net.JoinHostPort("127.0.0.1", addr)
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

type httpServerSource struct {
	address     string
	path        string
	framing     string
	maxBody     int64
	maxMessages int
	maxSize     int64  // the pipeline's max_message_size
	token       []byte // sha256 of "Bearer <auth_token>"; nil without one
	timeout     time.Duration
	readTimeout time.Duration
	slots       chan struct{} // one per request being handled (max_requests)
	log         *slog.Logger

	// run names this process's requests without an idempotency key, and requests counts them.
	run      string
	requests atomic.Int64

	counted  metric.Int64Counter // requests, by status
	messages metric.Int64Counter // messages of requests answered 202
	node     attribute.KeyValue
}

func newHTTPServerSource(config flow.Attrs, env Env) (*httpServerSource, error) {
	s := &httpServerSource{
		address: httpServerAddress(config.String(httpServerFieldAddress)), path: config.String(httpServerFieldPath),
		framing: config.String(httpServerFieldFraming), maxBody: int64(config.Size(httpServerFieldMaxBody)),
		maxMessages: int(config.Int(httpServerFieldMaxMessages)), maxSize: env.MaxMessageSize,
		timeout: config.Duration(httpServerFieldTimeout), readTimeout: config.Duration(httpServerFieldReadTimeout),
		slots: make(chan struct{}, config.Int(httpServerFieldMaxRequests)), log: env.Logger, run: NewRunID(),
		node: attribute.String("flowrun.node", env.Node),
	}
	if config.Has(httpServerFieldAuthToken) {
		sum := sha256.Sum256([]byte("Bearer " + config.String(httpServerFieldAuthToken)))
		s.token = sum[:]
	}
	if s.maxSize <= 0 {
		s.maxSize = 1 << 62
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	meter := env.Meter
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	var err error
	if s.counted, err = meter.Int64Counter("flowrun.http_server.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests an http_server source answered, by status: 202 taken, others refused.")); err != nil {
		return nil, err
	}
	if s.messages, err = meter.Int64Counter("flowrun.http_server.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages of the requests an http_server source answered 202.")); err != nil {
		return nil, err
	}
	return s, nil
}

// Produce serves requests until ctx ends, then stops taking new ones and waits for those in flight
// (each bounded by read_timeout and timeout) before it returns.
func (s *httpServerSource) Produce(ctx context.Context, out Emitter) error {
	ln, err := net.Listen("tcp", s.address)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.address, err)
	}
	srv := &http.Server{
		Handler:           s.handler(out),
		ReadHeaderTimeout: min(10*time.Second, s.readTimeout),
		ReadTimeout:       s.readTimeout,
		WriteTimeout:      s.readTimeout + s.timeout + 5*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s.log.Info("taking messages over HTTP", "url", "http://"+ln.Addr().String()+s.path)
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("serving HTTP on %s: %w", s.address, err)
	}
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.readTimeout+s.timeout+5*time.Second)
	defer cancel()
	if err := srv.Shutdown(stop); err != nil {
		_ = srv.Close() // requests still running past their own timeouts are cut off
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving HTTP on %s: %w", s.address, err)
	}
	return ctx.Err()
}

// handler returns the source's HTTP handler, which passes requests' messages to out.
func (s *httpServerSource) handler(out Emitter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, n := s.serve(w, r, out)
		s.counted.Add(r.Context(), 1, metric.WithAttributes(s.node, attribute.Int("http.response.status_code", status)))
		if status == http.StatusAccepted {
			s.messages.Add(r.Context(), int64(n), metric.WithAttributes(s.node))
		}
	})
}

// serve answers one request, and returns its status and how many messages it carried.
func (s *httpServerSource) serve(w http.ResponseWriter, r *http.Request, out Emitter) (int, int) {
	if r.URL.Path != s.path {
		return refuse(w, http.StatusNotFound, "nothing here: messages go to "+s.path), 0
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return refuse(w, http.StatusMethodNotAllowed, "send messages with POST"), 0
	}
	if s.token != nil {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], s.token) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			return refuse(w, http.StatusUnauthorized, "a valid Authorization: Bearer token is needed"), 0
		}
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		w.Header().Set("Retry-After", httpServerRetryAfter)
		return refuse(w, http.StatusTooManyRequests, "too many requests at once (max_requests)"), 0
	}
	key := r.Header.Get(IdempotencyKeyHeader)
	if err := checkIdempotencyKey(key); err != nil {
		return refuse(w, http.StatusBadRequest, err.Error()), 0
	}
	framing, status, err := s.framingOf(r)
	if err != nil {
		return refuse(w, status, err.Error()), 0
	}
	if r.ContentLength > s.maxBody {
		return refuse(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is %d bytes, more than max_body (%d bytes)", r.ContentLength, s.maxBody)), 0
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return refuse(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is more than max_body (%d bytes)", s.maxBody)), 0
		}
		return refuse(w, http.StatusBadRequest, "reading the body: "+err.Error()), 0
	}
	payloads, status, err := s.split(framing, body)
	if err != nil {
		return refuse(w, status, err.Error()), 0
	}
	ms, at := make([]Message, len(payloads)), make([]Origin, len(payloads))
	prefix := "k:" + key + ":"
	if key == "" {
		prefix = "r:" + s.run + "-" + strconv.FormatInt(s.requests.Add(1), 10) + ":"
	}
	for i, p := range payloads {
		ms[i] = NewMessage("", p.payload, nil)
		at[i] = Origin{ID: prefix + strconv.Itoa(i), Line: p.line}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	if tp := r.Header.Get("traceparent"); tp != "" {
		ctx = ContextWithTrace(ctx, tp, r.Header.Get("tracestate"))
	}
	ids, err := out.EmitAll(ctx, ms, at)
	var bad *EmitError
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(struct {
			IDs []string `json:"ids"`
		}{ids}) // a client that went away has its messages written anyway
		return http.StatusAccepted, len(ms)
	case errors.As(err, &bad) && bad.Index < len(payloads):
		return refuse(w, http.StatusBadRequest, payloads[bad.Index].where(framing)+": "+bad.Err.Error()), 0
	case errors.Is(err, ErrTopicFull):
		w.Header().Set("Retry-After", httpServerRetryAfter)
		return refuse(w, http.StatusTooManyRequests, "the pipeline is behind: its topic is at its max_lag; send the request again later"), 0
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		w.Header().Set("Retry-After", httpServerRetryAfter)
		return refuse(w, http.StatusServiceUnavailable, "Redis did not take the messages in time; send the request again later, "+
			"with the same "+IdempotencyKeyHeader+" header to have it written once"), 0
	}
	s.log.Error("a request failed", "err", err)
	return refuse(w, http.StatusInternalServerError, "the messages could not be passed on; nothing was written"), 0
}

// refuse answers a request with an error status and a JSON body that says why.
func refuse(w http.ResponseWriter, status int, why string) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{why}) // the client may be gone
	return status
}

// checkIdempotencyKey refuses a key that cannot name a request: too long, or with characters
// other than printable ASCII.
func checkIdempotencyKey(key string) error {
	if len(key) > maxIdempotencyKey {
		return fmt.Errorf("the %s header is longer than %d characters", IdempotencyKeyHeader, maxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return fmt.Errorf("the %s header may hold printable ASCII characters only, without spaces", IdempotencyKeyHeader)
		}
	}
	return nil
}

// framingOf returns how a request's body holds its messages ("auto" stays when only the body can
// tell), or the status and error that refuse it.
func (s *httpServerSource) framingOf(r *http.Request) (string, int, error) {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return "", http.StatusUnsupportedMediaType, fmt.Errorf("the Content-Encoding %q is not taken: send the body uncompressed", enc)
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" && s.framing != framingAuto {
		return s.framing, 0, nil
	}
	typ, _, err := mime.ParseMediaType(ct)
	var lines bool
	switch {
	case err != nil:
	case typ == "application/x-ndjson", typ == "application/ndjson", typ == "application/jsonl",
		typ == "application/x-jsonlines", typ == "application/jsonlines":
		lines = true
	case typ == "application/json", strings.HasPrefix(typ, "application/") && strings.HasSuffix(typ, "+json"):
	default:
		err = errors.New("not a JSON type")
	}
	if err != nil {
		return "", http.StatusUnsupportedMediaType, fmt.Errorf("the Content-Type %q is not taken: send application/json or application/x-ndjson", ct)
	}
	switch {
	case s.framing != framingAuto:
		return s.framing, 0, nil
	case lines:
		return framingNDJSON, 0, nil
	}
	return framingAuto, 0, nil
}

// bodyPayload is one message's payload in a request body, and where it is there.
type bodyPayload struct {
	payload []byte
	line    int64 // its line (ndjson) or element (json_array), from 1
}

// where names a payload in the body, for errors.
func (p bodyPayload) where(framing string) string {
	switch framing {
	case framingNDJSON:
		return "line " + strconv.FormatInt(p.line, 10)
	case framingJSONArray:
		return "element " + strconv.FormatInt(p.line, 10) + " of the array"
	}
	return "the body"
}

// split cuts a body into its messages' payloads and checks every one, or returns the status and
// error that refuse the request: the first payload that cannot be a message, named.
func (s *httpServerSource) split(framing string, body []byte) ([]bodyPayload, int, error) {
	if framing == framingAuto {
		framing = framingSingle
		if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
			framing = framingJSONArray
		}
	}
	var payloads []bodyPayload
	var err error
	switch framing {
	case framingNDJSON:
		payloads, err = s.splitLines(body)
	case framingJSONArray:
		payloads, err = s.splitArray(body)
	default:
		if p := bytes.TrimSpace(body); len(p) > 0 {
			payloads = []bodyPayload{{payload: p, line: 1}}
		}
	}
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	if len(payloads) == 0 {
		return nil, http.StatusBadRequest, errors.New("the body holds no message")
	}
	if len(payloads) > s.maxMessages {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the body holds more than max_messages (%d) messages", s.maxMessages)
	}
	for _, p := range payloads {
		if int64(len(p.payload)) > s.maxSize {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("%s: the message is %d bytes, more than max_message_size (%d bytes)",
				p.where(framing), len(p.payload), s.maxSize)
		}
		if err := CheckPayload(p.payload); err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("%s: %w", p.where(framing), err)
		}
	}
	return payloads, 0, nil
}

// splitLines returns the payloads of JSON lines, blank lines skipped.
func (s *httpServerSource) splitLines(body []byte) ([]bodyPayload, error) {
	var out []bodyPayload
	var line int64
	for len(body) > 0 {
		line++
		text := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			text, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if text = bytes.TrimSpace(text); len(text) > 0 {
			if out = append(out, bodyPayload{payload: text, line: line}); len(out) > s.maxMessages {
				return out, nil // too many: split says so
			}
		}
	}
	return out, nil
}

// splitArray returns the elements of a JSON array, which the caller checks one by one. It follows
// only strings and brackets, without recursion, so that any nesting costs the same; what is inside
// an element is the element's check's business.
func (s *httpServerSource) splitArray(body []byte) ([]bodyPayload, error) {
	notArray := errors.New("the body is not a JSON array of objects")
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '[' {
		return nil, notArray
	}
	i = skipSpace(body, i+1)
	var out []bodyPayload
	if i < len(body) && body[i] == ']' {
		if skipSpace(body, i+1) != len(body) {
			return nil, errors.New("the body has data after its JSON array")
		}
		return out, nil
	}
	for {
		start, depth := i, 0
	element:
		for ; i < len(body); i++ {
			switch body[i] {
			case '"':
				for i++; i < len(body) && body[i] != '"'; i++ {
					if body[i] == '\\' {
						i++
					}
				}
			case '[', '{':
				depth++
			case ']', '}':
				if depth == 0 {
					break element
				}
				depth--
			case ',':
				if depth == 0 {
					break element
				}
			}
		}
		if i >= len(body) {
			return nil, errors.New("the body's JSON array is not closed")
		}
		if out = append(out, bodyPayload{payload: bytes.TrimSpace(body[start:i]), line: int64(len(out) + 1)}); len(out) > s.maxMessages {
			return out, nil // too many: split says so
		}
		if body[i] == ']' {
			break
		}
		if body[i] != ',' {
			return nil, notArray
		}
		i++
	}
	if skipSpace(body, i+1) != len(body) {
		return nil, errors.New("the body has data after its JSON array")
	}
	return out, nil
}

// skipSpace returns the index of the first byte at or after i that is not JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
