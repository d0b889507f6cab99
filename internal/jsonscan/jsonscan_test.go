package jsonscan

import (
	"errors"
	"strings"
	"testing"
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
