// Package jsonscan checks the two things about JSON text that a syntax validator lets through and
// that flowrun must refuse where a message is first read: bytes that are not UTF-8 (encoding/json
// and gjson accept them inside strings, and the first encoder to touch them turns them into
// U+FFFD, so the message would change on its way), and nesting deeper than MaxDepth.
//
// It is the one payload rule of flowrun: transport/redis applies it to every entry it decodes
// (DecodeEntry), and package stages to payloads that do not come through Redis (a file source's
// lines, flowrun produce and eval). It lives under transport, the bottom of flowrun's imports, and
// imports only the standard library, so that transport/redis depends on nothing of flowrun's
// above transport (transport/redis's TestImportsNothingElseOfFlowrun checks both). FuzzCheck
// compares it with encoding/json.
package jsonscan

import (
	"bytes"
	"fmt"
	"unicode/utf8"
)

// MaxDepth is how deeply objects and arrays may nest in a payload: {"a":[1]} nests 2 deep.
//
// encoding/json stops at 10000 and gjson's validator recurses without a limit (20 MB of "[" takes a
// goroutine past its 1 GB stack, a crash no recover catches). The expression engine survives 10000,
// but go-cty, behind the functions that take the slow path, spends time quadratic in the depth
// (flatten on a value nested 4000 deep takes 2.3 s, 1000 deep 0.15 s), and a map stage runs
// without a timeout. 1000 is also the limit of Redis's Lua cjson and of Python's json: no JSON that
// other programs exchange comes near it.
const MaxDepth = 1000

// Error says why text was refused.
type Error struct {
	// Offset is the byte offset of the first invalid UTF-8 byte, or of the bracket that nests
	// too deep.
	Offset int
	// Depth is true for nesting past MaxDepth, false for invalid UTF-8.
	Depth bool
}

func (e *Error) Error() string {
	if e.Depth {
		return fmt.Sprintf("nested deeper than %d levels of objects and arrays (at byte %d)", MaxDepth, e.Offset)
	}
	return fmt.Sprintf("not valid UTF-8 (at byte %d)", e.Offset)
}

// Check returns an *Error when p is not valid UTF-8 or nests past MaxDepth, and nil otherwise. It
// does not check JSON syntax, and it allocates nothing unless it fails.
func Check(p []byte) error {
	if !utf8.Valid(p) {
		return &Error{Offset: invalidAt(p)}
	}
	// Nesting past MaxDepth takes more than MaxDepth opening brackets, and counting them is
	// cheap (vectorised): only text with that many pays for the scan that follows strings.
	if len(p) <= MaxDepth || bytes.Count(p, []byte{'['})+bytes.Count(p, []byte{'{'}) <= MaxDepth {
		return nil
	}
	if at := tooDeepAt(p); at >= 0 {
		return &Error{Offset: at, Depth: true}
	}
	return nil
}

// invalidAt returns the offset of the first byte of p that is not valid UTF-8.
func invalidAt(p []byte) int {
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(p)
}

// tooDeepAt returns the offset of the first bracket that opens level MaxDepth+1, or -1. Brackets
// inside strings do not count; the text need not be valid JSON.
func tooDeepAt(p []byte) int {
	depth := 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '"':
			end := stringEnd(p, i+1)
			if end < 0 {
				return -1
			}
			i = end
		case '[', '{':
			depth++
			if depth > MaxDepth {
				return i
			}
		case ']', '}':
			depth--
		}
	}
	return -1
}

// stringEnd returns the offset of the quote that closes the string starting at from, or -1.
func stringEnd(p []byte, from int) int {
	for i := from; i < len(p); {
		j := bytes.IndexByte(p[i:], '"')
		if j < 0 {
			return -1
		}
		i += j
		backslashes := 0
		for k := i - 1; k >= from && p[k] == '\\'; k-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return i
		}
		i++
	}
	return -1
}
