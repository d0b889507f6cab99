package flowtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/stages"
)

// What stands in for the pipeline's own components in a test: the capture behind every sink, canned
// answers for http sinks, and mocked Go stage functions.

// captures are what the sinks received, across the pipeline's incarnations of one test file.
type captures struct {
	mu       sync.Mutex
	received map[string][]Arrived // by "sink.NAME"
}

func newCaptures() *captures { return &captures{received: map[string][]Arrived{}} }

// since returns what sink received after the first n messages.
func (c *captures) since(sink string, n int) []Arrived {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.received[sink]
	if n > len(got) {
		return nil
	}
	return append([]Arrived(nil), got[n:]...)
}

// counts returns how many messages each sink has received so far.
func (c *captures) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.received))
	for k, v := range c.received {
		out[k] = len(v)
	}
	return out
}

func (c *captures) add(sink string, a Arrived) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.received[sink] = append(c.received[sink], a)
}

// captureSink records what a sink receives. With a real sink behind it (an http sink with canned
// answers, a redis_stream sink whose writes stay in the embedded Redis) it records what that sink
// delivered; alone, it delivers nothing anywhere.
type captureSink struct {
	name   string // "sink.NAME"
	store  *captures
	behind stages.Sink // nil: capture only
	// behindNow, if set, says whether behind delivers now: an http sink that only some runs
	// override is capture only in the others.
	behindNow func() bool
}

func (s *captureSink) Deliver(ctx context.Context, m *stages.Message, out []stages.Write) ([]stages.Write, error) {
	if s.behind != nil && (s.behindNow == nil || s.behindNow()) {
		var err error
		if out, err = s.behind.Deliver(ctx, m, out); err != nil {
			return out, err
		}
	}
	payload, err := m.Payload()
	if err != nil {
		return out, err
	}
	s.store.add(s.name, Arrived{Key: m.Key, Payload: bytes.Clone(payload), Where: s.name})
	return out, nil
}

// cannedAnswers answers an http sink's requests with the status codes of an override_sink, one per
// request, the last one again after the end; nothing leaves the process.
type cannedAnswers struct {
	mu        sync.Mutex
	responses []int
	next      int
}

func (c *cannedAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	c.mu.Lock()
	status := c.responses[min(c.next, len(c.responses)-1)]
	c.next++
	c.mu.Unlock()
	body := fmt.Sprintf("flowrun test: override_sink answers %d", status)
	return &http.Response{
		StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"text/plain"}},
		Body:          io.NopCloser(bytes.NewBufferString(body)),
		ContentLength: int64(len(body)), Request: req,
	}, nil
}

// sinkAnswers is the HTTP transport of an http sink that the file or one of its runs overrides: each
// request gets the canned answer of the override that applies when it is made.
type sinkAnswers struct {
	h    *harness
	sink string
}

func (s sinkAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	if a := s.h.answersOf(s.sink); a != nil {
		return a.RoundTrip(req)
	}
	return noNetwork{}.RoundTrip(req)
}

// noNetwork is the HTTP transport of everything in a test that has no canned answers: a test sends
// nothing outside.
type noNetwork struct{}

func (noNetwork) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return nil, errors.New("flowrun test: no request leaves the test (give the sink an override_sink)")
}

// mockFunc is a mocked Go stage function: each call takes the next of its results.
type mockFunc struct {
	mock  *testfile.Mock
	mu    sync.Mutex
	calls int
}

// result returns the result of the next call.
func (f *mockFunc) result() *testfile.MockResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.calls
	f.calls++
	for _, r := range f.mock.Results {
		if n < max(r.Times, 1) {
			return r
		}
		n -= max(r.Times, 1)
	}
	return f.mock.Results[len(f.mock.Results)-1]
}

// call is the stages.Func of the mock.
func (f *mockFunc) call(_ context.Context, m stages.Message) ([]stages.Message, error) {
	if len(f.mock.Results) == 0 {
		return []stages.Message{m}, nil
	}
	r := f.result()
	switch {
	case r.Error != "":
		err := errors.New(r.Error)
		if r.Permanent {
			return nil, stages.Permanent(err)
		}
		return nil, err
	case r.Drop:
		return nil, nil
	case r.Outputs == nil: // outputs = [] (not nil) returns no message
		return []stages.Message{m}, nil
	}
	out := make([]stages.Message, 0, len(r.Outputs))
	f.mu.Lock() // a MessageExpr evaluates one message at a time
	defer f.mu.Unlock()
	for _, e := range r.Outputs {
		v, err := e.Eval(m.Value)
		if err != nil {
			return nil, stages.Permanent(fmt.Errorf("mock %q: %w", f.mock.Func, err))
		}
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, stages.Permanent(fmt.Errorf("mock %q: an output is %T, not an object", f.mock.Func, v))
		}
		out = append(out, stages.Message{Key: m.Key, Value: obj, Headers: m.Headers})
	}
	return out, nil
}

// feed is what a test sends to a producing source: the source's kind does not run in a test, and a
// feedSource emits these messages in its place, through the runtime's own path for a source's
// messages (its key expression, its dead letters, its counters, its lease). It outlives a crash:
// what the dead process did not take, the next one does.
type feed struct {
	mu        sync.Mutex
	queue     []fed
	sent      int // messages pushed so far, for their IDs
	emitting  int // messages taken and not yet handed over (Emit has not returned)
	consumers int // feedSources producing now
	ready     chan struct{}
}

func newFeed() *feed { return &feed{ready: make(chan struct{}, 1)} }

// fed is a message for a source, with the ID that names it within the source (Origin.ID).
type fed struct {
	msg testfile.Message
	id  string
}

// push queues messages for the source.
func (f *feed) push(msgs ...testfile.Message) {
	f.mu.Lock()
	for _, m := range msgs {
		f.sent++
		f.queue = append(f.queue, fed{m, fmt.Sprintf("test-%d", f.sent)})
	}
	f.mu.Unlock()
	select {
	case f.ready <- struct{}{}:
	default:
	}
}

// busy reports whether the source is taking or about to take messages: the pipeline is not idle.
func (f *feed) busy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.emitting > 0 || (len(f.queue) > 0 && f.consumers > 0)
}

// queued returns how many messages wait for the source.
func (f *feed) queued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.queue) + f.emitting
}

// take returns the next message, counting it as being emitted.
func (f *feed) take() (fed, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.queue) == 0 {
		return fed{}, false
	}
	m := f.queue[0]
	f.queue = f.queue[1:]
	f.emitting++
	return m, true
}

func (f *feed) consuming(delta int) {
	f.mu.Lock()
	f.consumers += delta
	f.mu.Unlock()
}

// feedSource is the stages.Source of a producing source in a test.
type feedSource struct{ feed *feed }

func (s feedSource) Produce(ctx context.Context, out stages.Emitter) error {
	s.feed.consuming(1)
	defer s.feed.consuming(-1)
	for ctx.Err() == nil {
		m, ok := s.feed.take()
		if !ok {
			select {
			case <-s.feed.ready:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		err := out.Emit(ctx, stages.NewMessage(m.msg.Key, m.msg.Payload, nil),
			stages.Origin{ID: m.id, File: m.msg.Range.Filename, Line: int64(m.msg.Range.Start.Line)})
		s.feed.handed(m, err)
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// handed ends the emitting of m. A message Emit refused (the source stopped, or lost its lease
// while Emit waited) goes back to the head of the queue, under the same ID: the next run of the
// source takes it, as a real source would produce it again from its position or its start.
func (f *feed) handed(m fed, err error) {
	f.mu.Lock()
	f.emitting--
	if err != nil {
		f.queue = append([]fed{m}, f.queue...)
	}
	f.mu.Unlock()
}
