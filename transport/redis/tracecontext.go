package redis

// W3C Trace Context (https://www.w3.org/TR/trace-context/), as much as a receiver must check before
// it uses or passes on what an entry carries. Every entry that has a traceparent is checked, so the
// checks are a few comparisons per byte and allocate nothing.

// validTraceParent reports whether s is a traceparent a receiver may use:
//
//	version "-" trace-id "-" parent-id "-" trace-flags, for example
//	00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
//
// with every field lowercase hex, a trace-id and a parent-id that are not all zeros, and a version
// other than ff (invalid by the spec). Version 00 is exactly 55 characters. A later version is read
// by the prefix version 00 defines: at least 55 characters, and anything after them follows a dash.
func validTraceParent(s string) bool {
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if s[:2] == "00" {
		if len(s) != 55 {
			return false
		}
	} else if s[:2] == "ff" || len(s) > 55 && s[55] != '-' {
		return false
	}
	if !isLowerHex(s[0]) || !isLowerHex(s[1]) || !isLowerHex(s[53]) || !isLowerHex(s[54]) {
		return false
	}
	t0, t1, t2, t3 := word(s[3:11]), word(s[11:19]), word(s[19:27]), word(s[27:35])
	p0, p1 := word(s[36:44]), word(s[44:52])
	return lowerHex(t0) && lowerHex(t1) && lowerHex(t2) && lowerHex(t3) && lowerHex(p0) && lowerHex(p1) &&
		(t0|t1|t2|t3) != zeros && (p0|p1) != zeros // of hex digits, only '0's OR to '0'
}

func isLowerHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// The ids are checked eight characters at a time, as the bytes of a word.
const (
	ones  = 0x0101010101010101
	high  = 0x80 * ones
	zeros = '0' * ones
)

// word reads the first eight bytes of s as a little-endian word.
func word(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// lowerHex reports whether every byte of x is a lowercase hex digit. For bytes below 0x80, adding
// 0x80-lo sets a byte's top bit when it is at least lo, and adding 0x7f-hi when it is above hi; no
// byte carries into the next.
func lowerHex(x uint64) bool {
	if x&high != 0 {
		return false
	}
	digit := (x + (0x80-'0')*ones) &^ (x + (0x7f-'9')*ones)
	letter := (x + (0x80-'a')*ones) &^ (x + (0x7f-'f')*ones)
	return (digit|letter)&high == high
}

// maxTraceState bounds a tracestate: 32 list members (the most the spec allows) of up to 256
// characters each.
const maxTraceState = 32 * 257

// validTraceState is a cheap check of a tracestate: printable ASCII of a sensible length. Its
// list members are not parsed: the propagator does that where a span is started, and drops what it
// cannot read; an unsampled message passes its tracestate on unread, as the spec allows.
func validTraceState(s string) bool {
	if len(s) > maxTraceState {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
