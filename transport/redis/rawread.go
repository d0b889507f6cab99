package redis

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"
	"unsafe"

	goredis "github.com/redis/go-redis/v9"
)

// A group read's reply, parsed by flowrun rather than by go-redis.
//
// go-redis parses an XREADGROUP reply into a map[string]interface{} per entry (XMessage.Values):
// a map, a string for every field name and value, and an interface box for every value, 7
// allocations an entry of the job benchmark, and 15 % of its hop's CPU before DecodeEntry even
// looked at the entry. A go-redis command cannot bring a reply parser of its own (Cmder's
// readReply is unexported), but goredis.RawWriteToCmd hands the raw RESP reply to an io.Writer,
// and the command runs through the client's whole path (hooks, cluster routing and redirections,
// connection handling). readCmd is such a command: its writer, rawReply, keeps the reply in one
// buffer, and batchOf decodes the entries from it, their payloads sharing the buffer's memory.
//
// What the entries decode to is DecodeEntry's: an entry of the usual shape (a payload field and
// at most one each of key, headers, traceparent and tracestate) is decoded here by the same rules
// (rawFields.decode), and anything else, or anything those rules refuse, is turned into the
// goredis.XMessage that go-redis would have made and goes through Batch.add as before: flat
// entries, entries with other or repeated fields, malformed and too large entries. A stream of the
// reply that has an offloaded payload (payload_ref) is decoded wholly the old way, after
// fetchPayloads. FuzzRawRead checks that both ways agree on arbitrary entries.

// rawReadsUnder is how much of the client's read timeout a blocking read may wait in Redis to be
// read raw. go-redis gives its own blocking XREADGROUP a read deadline of the block plus 10 s,
// which a command made outside go-redis cannot ask for (the setter is unexported): a raw read has
// the client's read timeout, and it blocks only when at least half of that is left for the reply.
// A longer block is read by go-redis (DefaultBlock, 2 s, and the runtime's 500 ms are within the
// default 5 s).
const rawReadsUnder = 2

// rawReadable reports whether a group read that blocks for block (negative: not at all) can be
// read raw on this client.
func (c *Client) rawReadable(block time.Duration) bool {
	if c.readHints == nil {
		return false // a Client not made by Open
	}
	switch {
	case block < 0 || c.readTimeout < 0: // no BLOCK, or no read deadline at all
		return true
	case c.readTimeout == 0:
		return false
	}
	return block*rawReadsUnder <= c.readTimeout
}

// maxReserve bounds the buffer that a reply's first lines make room for; a larger reply grows it
// as it comes.
const maxReserve = 4 << 20

// readHints are what the raw reads of a client (and of the clients made from it) learnt of the
// replies they read, to size the next reply's buffer at once.
type readHints struct {
	entryBytes atomic.Int64 // reply bytes per entry in the last read that had entries
}

// entrySize is the hint of reply bytes per entry.
func (h *readHints) entrySize() int {
	if n := h.entryBytes.Load(); n > 0 {
		return int(n)
	}
	return 256
}

// readCmd is a command whose reply is kept raw in reply (see the top of this file).
type readCmd struct {
	*goredis.RawWriteToCmd
	reply *rawReply
}

func newReadCmd(ctx context.Context, hints *readHints, keyPos int8, args ...any) *readCmd {
	r := &rawReply{hints: hints}
	cmd := &readCmd{RawWriteToCmd: goredis.NewRawWriteToCmd(ctx, r, args...), reply: r}
	cmd.SetFirstKeyPos(keyPos)
	return cmd
}

// NoRetry: the command is retried as go-redis would retry a read (RawWriteToCmd is not, as it
// cannot take back what it wrote to its writer): rawReply starts again with every attempt (Args).
func (c *readCmd) NoRetry() bool { return false }

// Args returns the command's arguments. go-redis asks for them to write the command, once per
// attempt: a reply that an attempt left unfinished (its connection failed) is dropped there, so
// that the next attempt's reply starts afresh.
func (c *readCmd) Args() []any {
	c.reply.restart()
	return c.RawWriteToCmd.Args()
}

// rawReply is the writer of a readCmd: go-redis writes to it each line of the RESP reply without
// its CRLF, then the CRLF, and the data of a bulk string (with its CRLF) through ReadFrom. It keeps
// the whole reply in buf, and follows the reply's structure to know when it is complete. A reply
// that is an error (a top-level "-ERR ..." line) is returned by Write as the command's error, a
// Redis error reply as go-redis's own are, so that go-redis acts on it as on any error reply: a
// cluster client follows MOVED and ASK, a retry policy retries LOADING and TRYAGAIN.
type rawReply struct {
	hints    *readHints
	buf      []byte
	started  bool // the reply's first line was written
	pending  int  // the elements still to come, at every depth
	data     int  // the bytes of a bulk string still to come, with its CRLF
	crlf     bool // the last write was a line, whose CRLF comes next
	broken   bool // the attempt failed within a bulk string
	reserved bool // the buffer was sized for the reply's entries
}

// restart drops a reply that an attempt left unfinished.
func (r *rawReply) restart() {
	if r.started && !r.complete() {
		r.buf = r.buf[:0]
		r.started, r.pending, r.data, r.crlf, r.broken = false, 0, 0, false, false
	}
}

// complete reports whether the reply arrived whole.
func (r *rawReply) complete() bool {
	return r.started && r.pending == 0 && r.data == 0 && !r.crlf && !r.broken
}

func (r *rawReply) Write(p []byte) (int, error) {
	switch {
	case len(p) == 0:
		return 0, nil
	case r.crlf:
		if len(p) != 2 || p[0] != '\r' || p[1] != '\n' {
			r.broken = true
			return 0, errRawReply
		}
		r.crlf = false
		r.buf = append(r.buf, p...)
		return len(p), nil
	case r.data > 0: // a bulk string's data, should it come here rather than through ReadFrom
		if len(p) > r.data {
			r.broken = true
			return 0, errRawReply
		}
		r.data -= len(p)
		r.buf = append(r.buf, p...)
		return len(p), nil
	}
	line := p
	if len(line) >= 2 && line[len(line)-2] == '\r' && line[len(line)-1] == '\n' {
		line = line[:len(line)-2] // the line and its CRLF at once
	} else {
		r.crlf = true
	}
	if !r.started {
		if line[0] == '-' {
			// An error reply: the command's error. It is the whole reply, and was read whole.
			r.crlf = false
			return 0, replyError(line[1:])
		}
		r.started, r.pending = true, 1
	}
	if r.pending <= 0 {
		r.broken = true
		return 0, errRawReply
	}
	r.pending--
	if len(line) > 1 {
		switch n, ok := atoiRESP(line[1:]); {
		case !ok:
		case line[0] == '*' && n > 0:
			r.pending += n
			if n >= 8 && !r.reserved { // the reply's entries, most likely: room for them at once
				r.reserved = true
				size := min(n, DefaultReadCount) * r.hints.entrySize()
				r.reserve(min(size+size/8+512, maxReserve))
			}
		case line[0] == '$' && n >= 0:
			r.data = n + 2
		}
	}
	r.buf = append(r.buf, p...)
	return len(p), nil
}

// ReadFrom reads a bulk string's data and its CRLF: go-redis copies them with io.CopyN, whose
// io.LimitedReader says how many bytes come.
func (r *rawReply) ReadFrom(src io.Reader) (int64, error) {
	lr, ok := src.(*io.LimitedReader)
	if !ok || lr.N != int64(r.data) {
		r.broken = true
		return 0, errRawReply
	}
	n := r.data
	r.reserve(n)
	start := len(r.buf)
	got, err := io.ReadFull(lr.R, r.buf[start:start+n])
	r.buf = r.buf[:start+got]
	lr.N -= int64(got)
	r.data -= got
	if got < n {
		r.broken = true
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
	}
	return int64(got), err
}

// reserve makes room for n more bytes, at least doubling the buffer when it grows.
func (r *rawReply) reserve(n int) {
	if cap(r.buf)-len(r.buf) >= n {
		return
	}
	size := max(len(r.buf)+n, 2*cap(r.buf), 512)
	buf := make([]byte, len(r.buf), size)
	copy(buf, r.buf)
	r.buf = buf
}

// replyError is a Redis error reply ("NOGROUP No such key ..."), as go-redis's own error replies
// are: its text, and a RedisError method by which go-redis knows it for one.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks the error as a Redis error reply for go-redis (goredis.Error).
func (replyError) RedisError() {}

var _ goredis.Error = replyError("")

// errRawReply is a reply that is not what Redis sends for the command.
var errRawReply = errors.New("redis: unexpected reply")

// respScanner reads RESP2 values from a complete reply.
type respScanner struct {
	b []byte
	i int
}

// atoiRESP parses the length of a RESP header: decimal digits, or -1.
func atoiRESP(b []byte) (int, bool) {
	if len(b) == 2 && b[0] == '-' && b[1] == '1' {
		return -1, true
	}
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// header reads a header line of type t ("*3\r\n" for '*') and returns its length, -1 for a nil.
func (s *respScanner) header(t byte) (int, bool) {
	b := s.b[s.i:]
	if len(b) < 4 || b[0] != t {
		return 0, false
	}
	end := 1
	for end < len(b) && b[end] != '\r' {
		end++
	}
	if end+1 >= len(b) || b[end+1] != '\n' {
		return 0, false
	}
	n, ok := atoiRESP(b[1:end])
	if !ok {
		return 0, false
	}
	s.i += end + 2
	return n, true
}

// array reads an array's header: its length, -1 for a nil array.
func (s *respScanner) array() (int, bool) { return s.header('*') }

// bulk reads a bulk string (not a nil one).
func (s *respScanner) bulk() ([]byte, bool) {
	n, ok := s.header('$')
	if !ok || n < 0 || len(s.b)-s.i < n+2 || s.b[s.i+n] != '\r' || s.b[s.i+n+1] != '\n' {
		return nil, false
	}
	v := s.b[s.i : s.i+n : s.i+n]
	s.i += n + 2
	return v, true
}

// readGroupRaw is readGroupOnce's XREADGROUP read raw (see the top of this file).
func (c *Client) readGroupRaw(ctx context.Context, a ReadArgs, id string, block time.Duration) (Batch, error) {
	args := make([]any, 0, 11)
	args = append(args, "xreadgroup", "group", a.Group, a.Consumer, "count", a.Count)
	keyPos := int8(7)
	if block >= 0 {
		args = append(args, "block", int64(block/time.Millisecond))
		keyPos += 2
	}
	args = append(args, "streams", a.Stream, id)
	cmd := newReadCmd(ctx, c.readHints, keyPos, args...)
	if err := c.rdb.Process(ctx, cmd); err != nil {
		return Batch{}, wrap(classify(err), "reading group "+a.Group+" of", a.Stream)
	}
	if !cmd.reply.complete() {
		return Batch{}, wrap(errRawReply, "reading group "+a.Group+" of", a.Stream)
	}
	b, entries, err := c.batchOf(ctx, cmd.reply.buf)
	if errors.Is(err, errRawReply) {
		return Batch{}, wrap(err, "reading group "+a.Group+" of", a.Stream)
	}
	if err != nil {
		return Batch{}, err // fetching offloaded payloads, which says so
	}
	if entries > 0 {
		c.readHints.entryBytes.Store(int64(len(cmd.reply.buf) / entries))
	}
	return b, nil
}

// batchOf decodes an XREADGROUP reply (RESP2: an array of [stream, entries] pairs, or a nil array
// when nothing arrived), as readGroupOnce decodes go-redis's: each stream's offloaded payloads
// fetched, then every entry added to the batch. It returns the number of entries of the reply.
func (c *Client) batchOf(ctx context.Context, reply []byte) (Batch, int, error) {
	s := respScanner{b: reply}
	streams, ok := s.array()
	if !ok {
		return Batch{}, 0, errRawReply
	}
	var b Batch
	entries := 0
	for i := 0; i < streams; i++ {
		if n, ok := s.array(); !ok || n != 2 {
			return Batch{}, 0, errRawReply
		}
		stream, ok := s.bulk()
		if !ok {
			return Batch{}, 0, errRawReply
		}
		n, ok := s.array()
		if !ok || n < 0 {
			return Batch{}, 0, errRawReply
		}
		if streams == 1 { // sized at once rather than grown by appends
			b.Entries = make([]Entry, 0, n)
		}
		entries += n
		if err := c.addStream(ctx, &b, &s, string(stream), n); err != nil {
			return Batch{}, 0, err
		}
	}
	if s.i != len(reply) {
		return Batch{}, 0, errRawReply
	}
	return b, entries, nil
}

// addStream adds the n entries of one stream of a reply to b.
func (c *Client) addStream(ctx context.Context, b *Batch, s *respScanner, stream string, n int) error {
	start := *s
	entries, malformed, deleted := len(b.Entries), len(b.Malformed), len(b.Deleted)
	ids := idArena{}
	for range n {
		offloaded, ok := c.addRawEntry(b, s, &ids)
		if !ok {
			return errRawReply
		}
		if offloaded {
			// An entry whose payload is elsewhere: the stream's entries the old way, after
			// fetchPayloads, as go-redis would have given them.
			b.Entries, b.Malformed, b.Deleted = b.Entries[:entries], b.Malformed[:malformed], b.Deleted[:deleted]
			*s = start
			msgs := make([]goredis.XMessage, n)
			for i := range msgs {
				if msgs[i], ok = s.message(); !ok {
					return errRawReply
				}
			}
			if err := c.fetchPayloads(ctx, stream, msgs); err != nil {
				return err
			}
			for _, msg := range msgs {
				b.add(msg, c.maxEntrySize)
			}
			return nil
		}
	}
	return nil
}

// The fields decodeFast knows, as bits.
const (
	hasPayload = 1 << iota
	hasKey
	hasHeaders
	hasTraceParent
	hasTraceState
)

// rawFields are the fields of an entry of the usual shape, as read.
type rawFields struct {
	has                                            int
	payload, key, headers, traceParent, traceState []byte
	size                                           int64
}

// addRawEntry reads one entry ([id, [field, value, ...]], or [id, nil] for an entry deleted while
// pending) and adds it to b. offloaded: the entry has a payload_ref field and no payload, and
// nothing was added.
func (c *Client) addRawEntry(b *Batch, s *respScanner, ids *idArena) (offloaded, ok bool) {
	entry := s.i
	if n, ok := s.array(); !ok || n != 2 {
		return false, false
	}
	id, ok := s.bulk()
	if !ok {
		return false, false
	}
	n, ok := s.array()
	if !ok || n > 0 && n%2 != 0 {
		return false, false
	}
	if n < 0 {
		b.Deleted = append(b.Deleted, string(id))
		return false, true
	}
	var f rawFields
	usual, ref := true, false
	for range n / 2 {
		name, ok := s.bulk()
		if !ok {
			return false, false
		}
		value, ok := s.bulk()
		if !ok {
			return false, false
		}
		f.size += int64(len(name) + len(value))
		bit := 0
		switch string(name) {
		case FieldPayload:
			bit, f.payload = hasPayload, value
		case FieldKey:
			bit, f.key = hasKey, value
		case FieldHeaders:
			bit, f.headers = hasHeaders, value
		case FieldTraceParent:
			bit, f.traceParent = hasTraceParent, value
		case FieldTraceState:
			bit, f.traceState = hasTraceState, value
		case FieldPayloadRef:
			ref = true
		}
		if bit == 0 || f.has&bit != 0 {
			usual = false // another field, or one repeated: the general way
		}
		f.has |= bit
	}
	if ref && f.has&hasPayload == 0 {
		return true, true
	}
	if usual && f.has&hasPayload != 0 {
		if e, ok := f.decode(ids.str(id), c.maxEntrySize); ok {
			b.Entries = append(b.Entries, e)
			return false, true
		}
	}
	// The general way: the entry as go-redis would have given it, through DecodeEntry.
	end := s.i
	s.i = entry
	msg, _ := s.message() // read once already
	s.i = end
	b.add(msg, c.maxEntrySize)
	return false, true
}

// message reads one entry as go-redis does (readXMessage) into a goredis.XMessage.
func (s *respScanner) message() (goredis.XMessage, bool) {
	if n, ok := s.array(); !ok || n != 2 {
		return goredis.XMessage{}, false
	}
	id, ok := s.bulk()
	if !ok {
		return goredis.XMessage{}, false
	}
	n, ok := s.array()
	if !ok || n > 0 && n%2 != 0 {
		return goredis.XMessage{}, false
	}
	msg := goredis.XMessage{ID: string(id)}
	if n < 0 {
		return msg, true
	}
	msg.Values = make(map[string]any, n/2)
	for range n / 2 {
		name, ok := s.bulk()
		if !ok {
			return goredis.XMessage{}, false
		}
		value, ok := s.bulk()
		if !ok {
			return goredis.XMessage{}, false
		}
		msg.Values[string(name)] = string(value)
	}
	return msg, true
}

// decode decodes an entry of the usual shape by decodeEntry's rules. ok is false for an entry
// that decodeEntry would report as malformed (or too large), which the caller hands to it.
func (f *rawFields) decode(id string, maxSize int64) (Entry, bool) {
	if maxSize > 0 && f.size > maxSize {
		return Entry{}, false
	}
	e, reason := f.entry(id)
	return e, reason == ""
}

// idArena makes the IDs of a read's entries as strings that share a few small buffers, rather
// than one allocation each. A buffer is small so that an ID kept long after its batch keeps
// little else alive.
type idArena struct{ buf []byte }

func (a *idArena) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if cap(a.buf)-len(a.buf) < len(b) {
		a.buf = make([]byte, 0, max(len(b), 2048))
	}
	start := len(a.buf)
	a.buf = append(a.buf, b...)
	return unsafe.String(&a.buf[start], len(b))
}
