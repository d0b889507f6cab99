package stages

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// Messages are decoded and encoded here rather than by encoding/json, for memory: its Decoder
// copies the input into a buffer it grows by doubling (over three times a large payload's size,
// allocated on every decode), and its Encoder builds the output in a buffer of its own before
// copying it out. A 20 MB message that a map stage changed cost seven times its size in one hop;
// it now costs about one: the reply it was read from, whose memory its large strings share (a
// payload read from Redis is never modified), and a megabyte or two of its encoding at a time,
// which the commit writes to Redis piece by piece (Message.WritePayload, spill). A smaller message
// is encoded whole, into a buffer sized after the payload it came from.
//
// The results are those of encoding/json, with UseNumber for decoding and SetEscapeHTML(false)
// for encoding (FuzzPayloadCodec compares them). Values of types other than those a decoded
// payload holds (a Go stage function may put anything in Value) are encoded by encoding/json.

// decoder builds the value of JSON text that is known to be valid, valid UTF-8 and nested at most
// jsonscan.MaxDepth deep: it checks nothing, and recurses once per level.
type decoder struct {
	data []byte
	i    int
	// share: data is never modified (a payload read from Redis: NewEntryMessage), so a string that
	// is most of it may share its memory instead of being copied (see string).
	share bool
}

func (d *decoder) space() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) value() any {
	d.space()
	switch d.data[d.i] {
	case '{':
		return d.object()
	case '[':
		return d.array()
	case '"':
		return d.string()
	case 't':
		d.i += len("true")
		return true
	case 'f':
		d.i += len("false")
		return false
	case 'n':
		d.i += len("null")
		return nil
	}
	start := d.i
	for d.i < len(d.data) && isNumberByte(d.data[d.i]) {
		d.i++
	}
	return json.Number(d.data[start:d.i])
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

func (d *decoder) object() map[string]any { return d.fields(make(map[string]any), nil) }

// fields decodes, of the object at d.i, the members named in names into m, which must be empty,
// and skips the others; nil names decodes them all (object). A repeated name: the last one wins,
// as in encoding/json.
//
// With names, it stops reading once it has every name and nothing after can be a member of one of
// those names (namedAgain): a key read from a message's first field then skips the rest of the
// payload unread. Stopping leaves d.i inside the object, so names are only for the outermost
// object of the text; the objects inside it are decoded whole.
func (d *decoder) fields(m map[string]any, names []string) map[string]any {
	d.i++ // {
	d.space()
	if d.data[d.i] == '}' {
		d.i++
		return m
	}
	distinct := 0
	for i, n := range names {
		if !slices.Contains(names[:i], n) {
			distinct++
		}
	}
	for {
		d.space()
		var k string
		wanted := true
		if names == nil {
			k = d.string()
		} else {
			k, wanted = d.memberName(names)
		}
		d.space()
		d.i++ // :
		if wanted {
			m[k] = d.value()
			if names != nil && len(m) == distinct && !d.namedAgain(names) {
				return m
			}
		} else {
			d.skip()
		}
		d.space()
		d.i++ // , or }
		if d.data[d.i-1] == '}' {
			return m
		}
	}
}

// namedAgain reports whether a member after d.i might have one of names: the rest of the text has
// a backslash, or one of the names' bytes anywhere (in a member's name, or in a value: that is
// rare, and telling them apart would cost the reading that stopping saves).
func (d *decoder) namedAgain(names []string) bool {
	rest := d.data[d.i:]
	if bytes.IndexByte(rest, '\\') >= 0 {
		return true
	}
	for _, n := range names {
		if n == "" || bytes.Contains(rest, unsafe.Slice(unsafe.StringData(n), len(n))) {
			return true
		}
	}
	return false
}

// memberName reads a member's name and says whether it is one of names, making a string of it only
// when it is one or has escapes to undo.
func (d *decoder) memberName(names []string) (string, bool) {
	start := d.i + 1
	end := start + bytes.IndexByte(d.data[start:], '"')
	if bytes.IndexByte(d.data[start:end], '\\') >= 0 {
		k := d.string()
		return k, slices.Contains(names, k)
	}
	d.i = end + 1
	for _, n := range names {
		if string(d.data[start:end]) == n {
			return n, true
		}
	}
	return "", false
}

// rawMembers finds, in the object at d.i, the members named names, decoding nothing: values[i]
// is the JSON text of the value of the last member named names[i] (a repeated name: the last one
// wins, as decoding keeps it), nil when there is none. It returns false, telling nothing, when a
// member's name has escapes, which may spell one of names.
func (d *decoder) rawMembers(names []string, values [][]byte) bool {
	d.i++ // {
	d.space()
	if d.data[d.i] == '}' {
		return true
	}
	for {
		d.space()
		start := d.i + 1
		end := start + bytes.IndexByte(d.data[start:], '"')
		if bytes.IndexByte(d.data[start:end], '\\') >= 0 {
			return false
		}
		d.i = end + 1
		d.space()
		d.i++ // :
		d.space()
		from := d.i
		d.skip()
		for i, n := range names {
			if string(d.data[start:end]) == n {
				values[i] = bytes.TrimRight(d.data[from:d.i], " \t\n\r") // a number ends where its delimiter begins
			}
		}
		d.space()
		d.i++ // , or }
		if d.data[d.i-1] == '}' {
			return true
		}
	}
}

// skip moves past the value at d.i without decoding it.
func (d *decoder) skip() {
	d.space()
	depth := 0
	for {
		switch d.data[d.i] {
		case '"':
			d.skipString()
			if depth == 0 {
				return
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // the end of the object around a number or literal
				return
			}
			depth--
			if depth == 0 {
				d.i++
				return
			}
		case ',':
			if depth == 0 {
				return
			}
		}
		d.i++
	}
}

// skipString moves past the string at d.i. It looks for the quote that may end it, then for a
// backslash before that quote, each with IndexByte (bytes.IndexAny of both went a byte at a time);
// q is kept until an escape takes it, so that each byte is looked at about twice at most.
func (d *decoder) skipString() {
	d.i++   // "
	q := -1 // the next quote at or after d.i, once found
	for {
		if q < d.i {
			q = d.i + bytes.IndexByte(d.data[d.i:], '"')
		}
		b := bytes.IndexByte(d.data[d.i:q], '\\')
		if b < 0 {
			d.i = q + 1
			return
		}
		d.i += b + 2 // a backslash and the character it escapes
	}
}

func (d *decoder) array() []any {
	d.i++ // [
	a := []any{}
	d.space()
	if d.data[d.i] == ']' {
		d.i++
		return a
	}
	for {
		a = append(a, d.value())
		d.space()
		d.i++ // , or ]
		if d.data[d.i-1] == ']' {
			return a
		}
	}
}

// string reads a string; d.i is at its opening quote.
func (d *decoder) string() string {
	start := d.i + 1
	end := start + bytes.IndexByte(d.data[start:], '"')
	if bytes.IndexByte(d.data[start:end], '\\') < 0 {
		d.i = end + 1
		if d.share && 2*(end-start) >= len(d.data) && end > start {
			// A string that is at least half the payload (the body of a large document) shares
			// the payload's memory: a copy would double what the message costs, and keeping the
			// string keeps at most twice its size alive.
			return unsafe.String(&d.data[start], end-start)
		}
		return string(d.data[start:end])
	}
	return d.unescape(start)
}

// unescape reads a string with escapes from start, its first byte after the quote, as
// encoding/json does: an escaped surrogate that is not half of a pair becomes U+FFFD.
func (d *decoder) unescape(start int) string {
	b := make([]byte, 0, bytes.IndexByte(d.data[start:], '"')+8)
	i := start
	for {
		c := d.data[i]
		switch {
		case c == '"':
			d.i = i + 1
			return string(b)
		case c != '\\':
			b = append(b, c)
			i++
			continue
		}
		i++ // the backslash
		switch c := d.data[i]; c {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r := hex4(d.data[i+1 : i+5])
			i += 4
			if utf16.IsSurrogate(r) {
				if i+6 < len(d.data) && d.data[i+1] == '\\' && d.data[i+2] == 'u' {
					if pair := utf16.DecodeRune(r, hex4(d.data[i+3:i+7])); pair != unicode.ReplacementChar {
						b = utf8.AppendRune(b, pair)
						i += 7
						continue
					}
				}
				r = unicode.ReplacementChar
			}
			b = utf8.AppendRune(b, r)
		default: // " \ /
			b = append(b, c)
		}
		i++
	}
}

// hex4 reads four hex digits.
func hex4(p []byte) rune {
	var r rune
	for _, c := range p[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		default: // A-F
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendJSON appends the JSON encoding of v to b.
func appendJSON(b []byte, v any) ([]byte, error) { return appendJSONSpilling(b, v, nil) }

// appendJSONSpilling is appendJSON that, when s is not nil, passes b on to s whenever it has grown
// to a chunk, and goes on from an empty b (see spill).
func appendJSONSpilling(b []byte, v any, s *spill) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case string:
		if s != nil && len(v) > s.chunk {
			return s.string(b, v)
		}
		return appendString(b, v), nil
	case json.Number:
		if v == "" {
			return append(b, '0'), nil // as encoding/json writes an empty Number
		}
		if !isValidNumber(string(v)) {
			return appendOther(b, v) // for encoding/json's error
		}
		return append(b, v...), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return appendOther(b, v)
		}
		return appendFloat(b, v), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case map[string]any:
		if v == nil {
			return append(b, "null"...), nil
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			var err error
			if b, err = appendJSONSpilling(b, v[k], s); err != nil {
				return nil, err
			}
			if b, err = s.out(b); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case []any:
		if v == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSONSpilling(b, e, s); err != nil {
				return nil, err
			}
			if b, err = s.out(b); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	}
	return appendOther(b, v)
}

// appendOther appends what encoding/json makes of v.
func appendOther(b []byte, v any) ([]byte, error) {
	buf := bytes.NewBuffer(b)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// appendFloat formats a float as encoding/json does.
func appendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 is written e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// spill passes an encoding on in pieces while it is made, so that a large payload is never whole
// in memory (Message.WritePayload): once the encoding has grown to chunk bytes, write takes it and
// the encoding goes on in the same memory. A string longer than a chunk is written a chunk at a
// time.
type spill struct {
	chunk int
	write func([]byte) error
}

// out passes b on when it has grown to a chunk, and returns what to go on appending to. A nil s
// passes nothing on: the encoding is made whole.
func (s *spill) out(b []byte) ([]byte, error) {
	if s == nil || len(b) < s.chunk {
		return b, nil
	}
	if err := s.write(b); err != nil {
		return nil, err
	}
	return b[:0], nil
}

// string appends v quoted, as appendString does, a chunk of v at a time. Each chunk ends where a
// character starts, so that escaping the chunks one by one gives what escaping v whole gives.
func (s *spill) string(b []byte, v string) ([]byte, error) {
	b = append(b, '"')
	for v != "" {
		n := cutAtRune(v, s.chunk)
		b = appendEscaped(b, v[:n])
		v = v[n:]
		var err error
		if b, err = s.out(b); err != nil {
			return nil, err
		}
	}
	return append(b, '"'), nil
}

// cutAtRune returns where to cut v at about n bytes (n > 0) without cutting a character in two: n
// itself, or the start of the character that n falls in, or its end when it is v's first. A valid
// character is at most 4 bytes long; an invalid byte is escaped on its own wherever the cut is.
func cutAtRune(v string, n int) int {
	if n >= len(v) {
		return len(v)
	}
	for i := n; i >= 0 && i > n-utf8.UTFMax; i-- {
		if !utf8.RuneStart(v[i]) {
			continue
		}
		if i > 0 {
			return i
		}
		_, size := utf8.DecodeRuneInString(v)
		return max(size, n)
	}
	return n
}

// appendString appends s quoted as encoding/json does without HTML escaping: quotes, backslashes
// and control characters escaped, U+2028 and U+2029 too, invalid UTF-8 as U+FFFD.
func appendString(b []byte, s string) []byte {
	return append(appendEscaped(append(b, '"'), s), '"')
}

// appendEscaped appends s escaped as appendString does, without the quotes.
func appendEscaped(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}

// isValidNumber reports whether s is a JSON number, as encoding/json checks a json.Number.
func isValidNumber(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '-' {
		if s = s[1:]; s == "" {
			return false
		}
	}
	digits := func() {
		for len(s) > 0 && '0' <= s[0] && s[0] <= '9' {
			s = s[1:]
		}
	}
	switch {
	case s[0] == '0':
		s = s[1:]
	case '1' <= s[0] && s[0] <= '9':
		digits()
	default:
		return false
	}
	if len(s) >= 2 && s[0] == '.' && '0' <= s[1] && s[1] <= '9' {
		s = s[2:]
		digits()
	}
	if len(s) >= 2 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		if s[0] == '+' || s[0] == '-' {
			if s = s[1:]; s == "" {
				return false
			}
		}
		digits()
	}
	return s == ""
}
