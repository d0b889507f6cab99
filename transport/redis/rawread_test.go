package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The raw group read (rawread.go) against go-redis's: both read the same reply from a fake
// server, one through goredis.RawWriteToCmd and batchOf, the other through go-redis's XReadGroup
// and Batch.add, and must make the same batch.

// fakeRedis serves connections made by net.Pipe: XREADGROUP gets the reply of the next attempt
// (replies, the last one again and again), GET a value of values (nil when there is none), HELLO
// an error (go-redis then speaks RESP2 without it), anything else +OK. cut, when set, ends the
// connection after that many bytes of an XREADGROUP reply, once; closing ends it after every
// XREADGROUP reply, which a client then reads to its end and no further.
type fakeRedis struct {
	mu      sync.Mutex
	replies [][]byte
	values  map[string]string
	reads   int // XREADGROUP commands answered
	cut     int
	closing bool
	wg      sync.WaitGroup
}

func (f *fakeRedis) dial(context.Context, string, string) (net.Conn, error) {
	client, server := net.Pipe()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.serve(server)
	}()
	return client, nil
}

func (f *fakeRedis) serve(conn net.Conn) {
	defer conn.Close()
	rd := bufio.NewReader(conn)
	for {
		args, err := readCommand(rd)
		if err != nil {
			return
		}
		var out []byte
		f.mu.Lock()
		switch strings.ToLower(args[0]) {
		case "hello":
			out = []byte("-ERR unknown command 'hello'\r\n")
		case "xreadgroup":
			out = f.replies[min(f.reads, len(f.replies)-1)]
			f.reads++
			if f.cut > 0 && f.cut < len(out) {
				out, f.cut = out[:f.cut], 0
				f.mu.Unlock()
				_, _ = conn.Write(out)
				return
			}
			if f.closing {
				f.mu.Unlock()
				_, _ = conn.Write(out)
				return
			}
		case "get":
			if v, ok := f.values[args[1]]; ok {
				out = fmt.Appendf(nil, "$%d\r\n%s\r\n", len(v), v)
			} else {
				out = []byte("$-1\r\n")
			}
		default:
			out = []byte("+OK\r\n")
		}
		f.mu.Unlock()
		if _, err := conn.Write(out); err != nil {
			return
		}
	}
}

// readCommand reads a command as clients send it: an array of bulk strings.
func readCommand(rd *bufio.Reader) ([]string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 4 || line[0] != '*' {
		return nil, fmt.Errorf("not a command: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		line, err := rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(line[1:]))
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

// fakeClient returns a Client on f that reads raw, or through go-redis.
func fakeClient(t testing.TB, f *fakeRedis, maxSize int64, retries int, raw bool) *Client {
	t.Helper()
	rdb := goredis.NewClient(&goredis.Options{
		Addr: "127.0.0.1:1", Dialer: f.dial, Protocol: 2, DisableIdentity: true, MaxRetries: retries,
		ReadTimeout: 2 * time.Second, ContextTimeoutEnabled: true, PoolSize: 1,
	})
	t.Cleanup(func() {
		_ = rdb.Close()
		f.wg.Wait()
	})
	if raw {
		return &Client{rdb: rdb, desc: "fake", readTimeout: 2 * time.Second, readHints: &readHints{}, maxEntrySize: maxSize}
	}
	return &Client{rdb: rdb, desc: "fake", maxEntrySize: maxSize}
}

// testEntry is an entry of a reply: its fields in order, or nil fields for an entry deleted while
// pending.
type testEntry struct {
	id     string
	fields []string // name, value, name, value...
}

func appendBulk(b []byte, s string) []byte { return fmt.Appendf(b, "$%d\r\n%s\r\n", len(s), s) }

// xreadReply is the RESP2 reply of an XREADGROUP of one stream.
func xreadReply(stream string, entries []testEntry) []byte {
	b := appendBulk([]byte("*1\r\n*2\r\n"), stream)
	b = fmt.Appendf(b, "*%d\r\n", len(entries))
	for _, e := range entries {
		b = appendBulk(append(b, "*2\r\n"...), e.id)
		if e.fields == nil {
			b = append(b, "*-1\r\n"...)
			continue
		}
		b = fmt.Appendf(b, "*%d\r\n", len(e.fields))
		for _, f := range e.fields {
			b = appendBulk(b, f)
		}
	}
	return b
}

// readBoth reads reply raw and through go-redis.
func readBoth(t testing.TB, reply []byte, values map[string]string, maxSize int64, closing bool) (raw, typed Batch, rawErr, typedErr error) {
	t.Helper()
	ctx := context.Background()
	a := ReadArgs{Stream: "s", Group: "g", Consumer: "c", Block: -1}
	raw, rawErr = fakeClient(t, &fakeRedis{replies: [][]byte{reply}, values: values, closing: closing}, maxSize, -1, true).ReadGroup(ctx, a)
	typed, typedErr = fakeClient(t, &fakeRedis{replies: [][]byte{reply}, values: values, closing: closing}, maxSize, -1, false).ReadGroup(ctx, a)
	return raw, typed, rawErr, typedErr
}

// utf8Reason is decodeFlat's reason for a field that is not valid UTF-8: of several such fields,
// the one it names depends on the order of a map.
var utf8Reason = regexp.MustCompile(`^field ".*" is not valid UTF-8$`)

func sameBatches(t testing.TB, raw, typed Batch) {
	t.Helper()
	if len(raw.Malformed) == len(typed.Malformed) {
		for i, m := range raw.Malformed {
			if n := typed.Malformed[i]; m.Reason != n.Reason && utf8Reason.MatchString(m.Reason) && utf8Reason.MatchString(n.Reason) {
				m2 := *m
				m2.Reason = n.Reason
				raw.Malformed = append([]*MalformedEntryError(nil), raw.Malformed...)
				raw.Malformed[i] = &m2
			}
		}
	}
	if !reflect.DeepEqual(raw, typed) {
		t.Fatalf("the raw read and go-redis's differ:\nraw   %#v\ntyped %#v\n%s", raw, typed, describeMalformed(raw, typed))
	}
}

func describeMalformed(bs ...Batch) string {
	var b strings.Builder
	for _, batch := range bs {
		for _, m := range batch.Malformed {
			fmt.Fprintf(&b, "%s: %q %q\n", m.ID, m.Reason, m.Fields)
		}
		b.WriteString("--\n")
	}
	return b.String()
}

const goodTraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestRawReadAsGoRedis(t *testing.T) {
	long := `{"pad":"` + strings.Repeat("x", 3000) + `"}`
	ref := "s" + payloadKeyInfix + "1-9"
	for _, tc := range []struct {
		name    string
		entries []testEntry
		maxSize int64
	}{
		{"usual", []testEntry{
			{"1-1", []string{"payload", `{"a":1}`}},
			{"1-2", []string{"payload", `[1]`, "key", "k", "headers", `{"flowrun-wm":"17"}`}},
			{"1-3", []string{"key", "k", "payload", `2`, "traceparent", goodTraceParent, "tracestate", "a=b"}},
			{"1-4", []string{"payload", `"x"`, "traceparent", "nope", "tracestate", "a=b"}},
			{"1-5", []string{"payload", `{}`, "headers", `{"a":"\u00e9\n"}`}},
		}, 0},
		{"malformed", []testEntry{
			{"1-1", []string{"payload", `{"a":`}},
			{"1-2", []string{"payload", `1`, "headers", `nope`}},
			{"1-3", []string{"payload", `1`, "key", "\xff"}},
			{"1-4", []string{"payload", `"\xff"`}},
			{"1-5", []string{"payload", strings.Repeat("[", 2000) + strings.Repeat("]", 2000)}},
			{"1-6", []string{}},
			{"1-7", []string{"payload", `1`, "headers", "{\"a\":\"\xff\"}"}},
		}, 0},
		{"deleted", []testEntry{{"1-1", nil}, {"1-2", []string{"payload", `1`}}, {"1-3", nil}}, 0},
		{"flat and other fields", []testEntry{
			{"1-1", []string{"type", "order", "amount", "9"}},
			{"1-2", []string{"payload", `1`, "extra", "x"}},
			{"1-3", []string{"payload", `1`, "payload", `2`}},
			{"1-4", []string{"payload", `1`, "key", "a", "key", "b"}},
			{"1-5", []string{"traceparent", goodTraceParent, "a", "b"}},
			{"1-6", []string{"a", "\xff"}},
		}, 0},
		{"too large", []testEntry{
			{"1-1", []string{"payload", long}},
			{"1-2", []string{"payload", `1`, "key", strings.Repeat("k", 3000)}},
			{"1-3", []string{"payload", `1`}},
			{"1-4", []string{"payload", `1`, "other", long}},
		}, 1000},
		{"offloaded", []testEntry{
			{"1-1", []string{"payload", `1`}},
			{"1-2", []string{FieldPayloadRef, ref, "key", "k"}},
			{"1-3", []string{FieldPayloadRef, "s" + payloadKeyInfix + "gone"}},
			{"1-4", []string{FieldPayloadRef, "elsewhere"}},
			{"1-5", nil},
		}, 0},
		{"empty", []testEntry{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, typed, rawErr, typedErr := readBoth(t, xreadReply("s", tc.entries), map[string]string{ref: `{"big":true}`}, tc.maxSize, false)
			if rawErr != nil || typedErr != nil {
				t.Fatalf("raw: %v, go-redis: %v", rawErr, typedErr)
			}
			sameBatches(t, raw, typed)
			if len(tc.entries) > 0 && raw.Len() != len(tc.entries) {
				t.Fatalf("%d entries in the batch, want %d", raw.Len(), len(tc.entries))
			}
		})
	}
	t.Run("nothing arrived", func(t *testing.T) {
		raw, typed, rawErr, typedErr := readBoth(t, []byte("*-1\r\n"), nil, 0, false)
		if rawErr != nil || typedErr != nil || raw.Len() != 0 {
			t.Fatalf("raw: %+v %v, go-redis: %v", raw, rawErr, typedErr)
		}
		sameBatches(t, raw, typed)
	})
	t.Run("error reply", func(t *testing.T) {
		_, _, rawErr, typedErr := readBoth(t, []byte("-NOGROUP No such key 's' or consumer group 'g'\r\n"), nil, 0, false)
		if rawErr == nil || typedErr == nil || rawErr.Error() != typedErr.Error() || !errors.Is(rawErr, ErrNoGroup) {
			t.Fatalf("raw: %v, go-redis: %v", rawErr, typedErr)
		}
		var re goredis.Error
		if !errors.As(rawErr, &re) {
			t.Fatalf("%v is not a Redis error reply for go-redis", rawErr)
		}
	})
}

// TestRawReadPayloadsAreTheirOwn: a payload shares the reply's memory, and appending to it does
// not write over the next entry.
func TestRawReadPayloadsAreTheirOwn(t *testing.T) {
	raw, _, err, _ := readBoth(t, xreadReply("s", []testEntry{
		{"1-1", []string{"payload", `1`}}, {"1-2", []string{"payload", `2`}},
	}), nil, 0, false)
	if err != nil || len(raw.Entries) != 2 {
		t.Fatal(raw, err)
	}
	_ = append(raw.Entries[0].Payload, "xxxxxxxxxxxxxxxxxxxxxxxx"...)
	if string(raw.Entries[1].Payload) != "2" || raw.Entries[1].ID != "1-2" {
		t.Fatalf("the second entry changed: %+v", raw.Entries[1])
	}
}

// TestRawReadRetriesAsGoRedis: an attempt whose connection fails within the reply is retried as
// go-redis retries a read, and the next attempt's reply is read afresh.
func TestRawReadRetriesAsGoRedis(t *testing.T) {
	var entries []testEntry
	for i := range 50 {
		entries = append(entries, testEntry{fmt.Sprintf("1-%d", i), []string{"payload", strconv.Itoa(i), "key", "k"}})
	}
	reply := xreadReply("s", entries)
	for _, cut := range []int{3, len(reply) / 2, len(reply) - 1} {
		f := &fakeRedis{replies: [][]byte{reply}, cut: cut}
		rc := fakeClient(t, f, 0, 2, true)
		tc := fakeClient(t, &fakeRedis{replies: [][]byte{reply}}, 0, -1, false)
		ctx := context.Background()
		a := ReadArgs{Stream: "s", Group: "g", Consumer: "c", Block: -1}
		raw, err := rc.ReadGroup(ctx, a)
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if f.reads != 2 {
			t.Fatalf("cut at %d: %d attempts, want 2", cut, f.reads)
		}
		typed, err := tc.ReadGroup(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		sameBatches(t, raw, typed)
	}
	// Without retries, the failure is the caller's, as with go-redis.
	f := &fakeRedis{replies: [][]byte{reply}, cut: len(reply) / 2}
	rc := fakeClient(t, f, 0, -1, true)
	if _, err := rc.ReadGroup(context.Background(), ReadArgs{Stream: "s", Group: "g", Consumer: "c", Block: -1}); err == nil {
		t.Fatal("a reply cut short was read")
	}
}

// FuzzRawRead builds replies of arbitrary entries (see fuzzEntries) and checks that the raw read
// makes the batch that go-redis's read makes.
func FuzzRawRead(f *testing.F) {
	for _, s := range []string{
		"payload\xfd{\"a\":1}",
		"payload\xfd[1]\xfekey\xfdk\xfeheaders\xfd{\"x\":\"y\"}\xfftraceparent\xfd" + goodTraceParent + "\xfepayload\xfd2\xfetracestate\xfda=b",
		"type\xfdorder\xfeamount\xfd9\xff\xfc\xff",
		"payload\xfd{\xffpayload\xfd1\xfeheaders\xfd[]\xff\xffpayload\xfd1\xfepayload\xfd2",
		"payload_ref\xfds:payload:x\xfekey\xfdk\xffpayload\xfd\"\xff\"",
		"payload\xfd1\xfekey\xfd\xff\xfe",
	} {
		f.Add(s, uint16(0))
		f.Add(s, uint16(20))
	}
	f.Fuzz(func(t *testing.T, spec string, maxSize uint16) {
		entries := fuzzEntries(spec)
		raw, typed, rawErr, typedErr := readBoth(t, xreadReply("s", entries), map[string]string{"s:payload:x": `{"x":1}`}, int64(maxSize), false)
		if rawErr != nil || typedErr != nil {
			t.Fatalf("raw: %v, go-redis: %v", rawErr, typedErr)
		}
		sameBatches(t, raw, typed)
	})
}

// fuzzEntries turns a fuzz input into entries: entries are separated by \xff, fields by \xfe, a
// name from its value by \xfd; an entry "\xfc" was deleted while pending.
func fuzzEntries(spec string) []testEntry {
	var entries []testEntry
	for i, part := range strings.Split(spec, "\xff") {
		e := testEntry{id: fmt.Sprintf("1-%d", i)}
		if part != "\xfc" {
			e.fields = []string{}
			if part != "" {
				for _, field := range strings.Split(part, "\xfe") {
					name, value, _ := strings.Cut(field, "\xfd")
					e.fields = append(e.fields, name, value)
				}
			}
		}
		entries = append(entries, e)
	}
	return entries
}

var hugeLength = regexp.MustCompile(`[*$%][0-9]{6}`)

// FuzzRawReply feeds arbitrary bytes as the reply: the raw read must not panic, and a reply it
// reads, go-redis must read to the same batch.
func FuzzRawReply(f *testing.F) {
	f.Add(xreadReply("s", []testEntry{{"1-1", []string{"payload", "1"}}, {"1-2", nil}}))
	f.Add(xreadReply("s", []testEntry{{"1-1", []string{"payload", "1", "key", "k"}}, {"1-2", []string{}}}))
	f.Add([]byte("*-1\r\n"))
	f.Add([]byte("*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*1\r\n$7\r\npayload\r\n"))
	f.Add([]byte("-ERR no\r\n"))
	f.Fuzz(func(t *testing.T, reply []byte) {
		if len(reply) == 0 || hugeLength.Match(reply) {
			return // go-redis would allocate for a billion elements before it found them missing
		}
		raw, typed, rawErr, typedErr := readBoth(t, reply, nil, 0, true)
		if rawErr != nil {
			return
		}
		if typedErr != nil {
			t.Fatalf("the raw read read what go-redis does not (%v): %q", typedErr, reply)
		}
		sameBatches(t, raw, typed)
	})
}

func BenchmarkBatchOf(b *testing.B) {
	var entries []testEntry
	payload := `{"ts":1764478823321000000,"seq":"f000001234","key":"k0421","id":"f000001233","amount":1234,"at":1764478823321,"pad":"` + strings.Repeat("x", 80) + `"}`
	for i := range 1000 {
		entries = append(entries, testEntry{fmt.Sprintf("1764478823321-%d", i), []string{"payload", payload, "key", "k0421", "headers", `{"flowrun-wm":"1764478823321"}`}})
	}
	reply := xreadReply("s", entries)
	c := &Client{readHints: &readHints{}, maxEntrySize: 64 << 20}
	b.ReportAllocs()
	for b.Loop() {
		batch, _, err := c.batchOf(context.Background(), reply)
		if err != nil || len(batch.Entries) != 1000 {
			b.Fatal(err)
		}
	}
}
