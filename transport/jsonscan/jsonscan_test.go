package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

func nested(depth int) string {
	return strings.Repeat(`{"a":[`, depth/2) + strings.Repeat(`]}`, depth/2)
}

func TestCheck(t *testing.T) {
	cases := []struct {
		text   string
		offset int  // -1: accepted
		depth  bool // refused for its depth
	}{
		{`{"a":"b"}`, -1, false},
		{`{"name":"Zoë","city":"Łódź","emoji":"👩‍👩‍👧"}`, -1, false},
		{"{\"a\":\"\xff\"}", 6, false},
		{"{\"a\":\"ok\xe2\x82\"}", 8, false},   // a truncated sequence
		{"{\"a\":\"\xed\xa0\x80\"}", 6, false}, // an encoded surrogate
		{nested(MaxDepth), -1, false},          // exactly at the limit
		{nested(MaxDepth + 2), 6 * MaxDepth / 2, true},
		{strings.Repeat("[", MaxDepth+1), MaxDepth, true}, // unclosed: still refused
		// Brackets inside strings do not nest, escaped quotes do not end the string.
		{`{"s":"` + strings.Repeat(`[{\"`, MaxDepth) + `"}`, -1, false},
		{`{"s":"\\"}` + strings.Repeat("[", MaxDepth), -1, false},
		{`["\\\"` + strings.Repeat("[", MaxDepth+1) + `"]`, -1, false},
		{`["\\\\"` + strings.Repeat("[", MaxDepth+1), 6 + MaxDepth, true},
	}
	for _, c := range cases {
		err := Check([]byte(c.text))
		name := c.text
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		if c.offset < 0 {
			if err != nil {
				t.Errorf("%q: %v, want accepted", name, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Offset != c.offset || e.Depth != c.depth {
			t.Errorf("%q: %#v, want offset %d, depth %v", name, err, c.offset, c.depth)
		}
	}
	if err := Check([]byte(nested(MaxDepth + 2))); err == nil || !strings.Contains(err.Error(), "deeper than 1000 levels") {
		t.Errorf("depth error says %q", err)
	}
	if err := Check([]byte("\xff")); err == nil || !strings.Contains(err.Error(), "not valid UTF-8 (at byte 0)") {
		t.Errorf("UTF-8 error says %q", err)
	}
}

// TestCheckAllocatesNothing keeps the check off the garbage collector's path of every message.
func TestCheckAllocatesNothing(t *testing.T) {
	p := []byte(`{"items":[` + strings.Repeat(`{"sku":"a","qty":[1]},`, 600) + `{}]}`)
	if n := testing.AllocsPerRun(100, func() { _ = Check(p) }); n != 0 {
		t.Errorf("Check allocates %v times", n)
	}
}

func BenchmarkCheck(b *testing.B) {
	for _, c := range []struct {
		name string
		text string
	}{
		{"small", `{"customer_id":"c-42","amount":99.5,"country":"de"}`},
		{"2KB", `{"items":[` + strings.Repeat(`{"sku":"abc","qty":1},`, 90) + `{}]}`},
		{"2000 objects", `{"items":[` + strings.Repeat(`{"sku":"abc","qty":1},`, 2000) + `{}]}`},
	} {
		p := []byte(c.text)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				_ = Check(p)
			}
		})
	}
}

// FuzzCheck compares Check with what encoding/json and unicode/utf8 say of the same text: text is
// refused for its bytes exactly when it is not valid UTF-8, at the first invalid byte; valid JSON
// is refused for its depth exactly when encoding/json's tokens nest past MaxDepth, at the bracket
// that opens level MaxDepth+1. Of text that is not JSON, Check only has to point at a bracket.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"a":"b"}`, `[]`, `"s"`, `{"s":"\\"}`, `["\\\""]`, "{\"a\":\"\xff\"}", "ok\xe2\x82",
		nested(MaxDepth), nested(MaxDepth + 2), strings.Repeat("[", MaxDepth+1),
		`{"s":"` + strings.Repeat(`[{\"`, MaxDepth) + `"}`,
		`["\\\\"` + strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+2),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		err := Check(p)
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("error is not an *Error: %v", err)
		}
		if !utf8.Valid(p) {
			if e == nil || e.Depth || !utf8.Valid(p[:e.Offset]) {
				t.Fatalf("invalid UTF-8 %q: %#v, want the offset of its first invalid byte", p, err)
			}
			if r, size := utf8.DecodeRune(p[e.Offset:]); r != utf8.RuneError || size != 1 {
				t.Fatalf("invalid UTF-8 %q: offset %d is not an invalid byte", p, e.Offset)
			}
			return
		}
		if e != nil && (!e.Depth || e.Offset < 0 || e.Offset >= len(p) || (p[e.Offset] != '[' && p[e.Offset] != '{')) {
			t.Fatalf("%q: %#v, want a depth error at a bracket", p, err)
		}
		if !json.Valid(p) {
			return
		}
		want := tooDeepByDecoder(t, p)
		switch {
		case want < 0 && e != nil:
			t.Fatalf("%q nests at most %d deep, but Check says %v", p, MaxDepth, err)
		case want >= 0 && (e == nil || e.Offset != want):
			t.Fatalf("%q opens level %d at byte %d, but Check says %v", p, MaxDepth+1, want, err)
		}
	})
}

// tooDeepByDecoder returns the offset of the bracket that opens level MaxDepth+1 of valid JSON
// text, by encoding/json's tokens, or -1.
func tooDeepByDecoder(t *testing.T, p []byte) int {
	dec := json.NewDecoder(bytes.NewReader(p))
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return -1
		}
		if err != nil {
			t.Fatalf("encoding/json reads valid JSON %q: %v", p, err)
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			if depth > MaxDepth {
				return int(dec.InputOffset()) - 1
			}
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}
