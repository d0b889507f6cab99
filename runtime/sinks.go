package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// newSink builds a sink kind's delivery.
func (r *runner) newSink(n *node, s *flow.Sink) (sink, error) {
	switch s.Kind {
	case "stdout":
		return &stdoutSink{w: r.stdout()}, nil
	case "file":
		return &fileSink{path: s.Config.String("path"), truncate: s.Config.String("mode") == "truncate"}, nil
	case "redis_stream":
		return &streamSink{r: r, node: n, stream: s.Config.String("stream"), maxLen: s.Config.Int("max_len")}, nil
	case "http":
		n.timeout = s.Config.Duration("timeout")
		n.lanes = httpLanes
		return &httpSink{
			client: r.opts.HTTPClient, url: s.Config.String("url"), method: s.Config.String("method"),
			headers: s.Config.StringMap("headers"), redact: r.plan.Redact,
		}, nil
	}
	return nil, &ConfigError{fmt.Sprintf("sink %s: unknown kind %q", s.Name, s.Kind)}
}

// httpLanes is how many requests an http sink has in flight per partition, keeping each key's order.
const httpLanes = 8

// lockedWriter is a buffered writer shared by the stdout sinks, so that lines never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  lineBuffer
}

// stdout returns the runner's shared standard output.
func (r *runner) stdout() *lockedWriter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		r.out = &lockedWriter{w: lineBuffer{w: r.opts.Stdout, size: 4 << 10}}
	}
	return r.out
}

func (l *lockedWriter) writeLine(b []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.writeLine(b)
}

func (l *lockedWriter) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.flush()
}

// lineBuffer buffers lines for a writer. Unlike a bufio.Writer, whose first error sticks and fails
// every later write, it keeps what a failed write did not take and writes it with the next flush:
// a sink whose output failed for a while (a full disk) goes on once it works again, and the lines
// that other batches (other partitions, other stdout sinks) left in the buffer are never dropped.
// The batch whose flush failed is delivered again, so its lines may come out twice.
type lineBuffer struct {
	w    io.Writer
	buf  []byte
	size int // the buffer is written out before it grows past size
}

// writeLine adds a line and its newline. When the buffer is full and cannot be written out, the
// line is not added: its delivery failed.
func (b *lineBuffer) writeLine(line []byte) error {
	if len(b.buf) > 0 && len(b.buf)+len(line)+1 > b.size {
		if err := b.flush(); err != nil {
			return err
		}
	}
	b.buf = append(b.buf, line...)
	b.buf = append(b.buf, '\n')
	return nil
}

// flush writes out what the buffer holds; what a failed write did not take stays for the next.
func (b *lineBuffer) flush() error {
	if len(b.buf) == 0 {
		return nil
	}
	n, err := b.w.Write(b.buf)
	n = min(max(n, 0), len(b.buf))
	if err == nil && n < len(b.buf) {
		err = io.ErrShortWrite
	}
	b.buf = b.buf[:copy(b.buf, b.buf[n:])]
	if err == nil && cap(b.buf) > 4*b.size {
		b.buf = nil // a very long line passed: do not keep its memory
	}
	return err
}

// stdoutSink prints each message's payload as a line of JSON.
type stdoutSink struct {
	noLifecycle
	w *lockedWriter
}

func (s *stdoutSink) deliver(_ context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	payload, err := m.msg.Payload()
	if err != nil {
		return outs, err
	}
	return outs, s.w.writeLine(payload)
}

func (s *stdoutSink) flush() error { return s.w.flush() }
func (s *stdoutSink) inline() bool { return true }

// fileSink appends each message's payload as a line of JSON to a file, and syncs the file before the
// batch is acknowledged, so that an acknowledged message is on disk.
type fileSink struct {
	path     string
	truncate bool // empty the file when the run opens it (mode = "truncate")
	mu       sync.Mutex
	f        *os.File
	w        lineBuffer
}

func (s *fileSink) open() error {
	// A job's output often goes to a directory of its own that nothing has made yet.
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_APPEND | os.O_CREATE
	if s.truncate {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(s.path, flags, 0o644)
	if err != nil {
		return err
	}
	s.f, s.w = f, lineBuffer{w: f, size: 64 << 10}
	return nil
}

func (s *fileSink) deliver(_ context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	payload, err := m.msg.Payload()
	if err != nil {
		return outs, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return outs, s.w.writeLine(payload)
}

func (s *fileSink) flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.w.flush(); err != nil {
		return err
	}
	return s.f.Sync()
}

func (s *fileSink) close() error {
	if s.f == nil {
		return nil
	}
	err := s.flush()
	return errors.Join(err, s.f.Close())
}

func (s *fileSink) inline() bool { return true }

// streamSink appends each message to a stream that other applications read, in the same round trip
// that acknowledges the batch.
type streamSink struct {
	noLifecycle
	r      *runner
	node   *node
	stream string
	maxLen int64
}

func (s *streamSink) deliver(_ context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	e, err := entryOf(m.msg.Key, &m.msg, m.out)
	if err != nil {
		return outs, err
	}
	out := redis.Output{Stream: s.stream, Entry: e, MaxLen: s.maxLen}
	if s.node.delivery == flow.EffectivelyOnce {
		out.DedupKey = s.r.keys.StreamDedup(s.stream, s.node.name, s.node.input.Name, m.partition, m.id)
	}
	return append(outs, out), nil
}

func (s *streamSink) inline() bool { return true }

// httpSink sends each message as a JSON request body. 2xx is success; 408, 429, 5xx and network
// errors are worth retrying; any other status fails the message for good.
type httpSink struct {
	noLifecycle
	client  *http.Client
	url     string
	method  string
	headers map[string]string
	redact  func(string) string // hides secrets (a token in the URL) in errors
}

func (s *httpSink) deliver(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	payload, err := m.msg.Payload()
	if err != nil {
		return outs, err
	}
	req, err := http.NewRequestWithContext(ctx, s.method, s.url, bytes.NewReader(payload))
	if err != nil {
		return outs, stages.Permanent(errors.New(s.redact(err.Error())))
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range s.headers {
		req.Header.Set(k, v)
	}
	if m.out.parent != "" {
		req.Header.Set("traceparent", m.out.parent)
		if m.out.state != "" {
			req.Header.Set("tracestate", m.out.state)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// Redacted, as the URL may hold a secret, and kept transient when it was (connection refused,
		// a timeout, DNS): the sink then pauses until the service is back.
		if stages.IsTransient(err) {
			return outs, stages.Transient(errors.New(s.redact(err.Error())))
		}
		return outs, errors.New(s.redact(err.Error()))
	}
	// Read a little of the body, so that the connection can be reused and the error can say why.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return outs, nil
	}
	err = errors.New(s.redact(fmt.Sprintf("%s %s: %s: %s", s.method, s.url, resp.Status, bytes.TrimSpace(body))))
	switch {
	case resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500:
		return outs, stages.TransientAfter(err, retryAfter(resp.Header.Get("Retry-After"), time.Now()))
	}
	return outs, stages.Permanent(err)
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

func (s *httpSink) inline() bool { return false }
