package redis

import (
	"strings"
	"testing"
)

// referenceTraceParent is validTraceParent written plainly, a character at a time.
func referenceTraceParent(s string) bool {
	hex := func(f string) bool {
		for i := 0; i < len(f); i++ {
			if !strings.ContainsRune("0123456789abcdef", rune(f[i])) {
				return false
			}
		}
		return true
	}
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	version, traceID, spanID, flags := s[:2], s[3:35], s[36:52], s[53:55]
	switch {
	case !hex(version) || version == "ff" || !hex(traceID) || !hex(spanID) || !hex(flags):
		return false
	case traceID == strings.Repeat("0", 32) || spanID == strings.Repeat("0", 16):
		return false
	case version == "00":
		return len(s) == 55
	}
	return len(s) == 55 || s[55] == '-'
}

// TestValidTraceParentEveryByte puts every byte value at every position of a traceparent (and of
// an all-zero one, whose ids are one digit from invalid): the word-at-a-time check agrees with
// the plain one on each.
func TestValidTraceParentEveryByte(t *testing.T) {
	for _, base := range []string{
		validTP,
		"00-00000000000000000000000000000001-0000000000000001-01",
		"00-10000000000000000000000000000000-1000000000000000-00",
		"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-abc",
	} {
		for i := 0; i < len(base); i++ {
			for c := 0; c < 256; c++ {
				s := base[:i] + string([]byte{byte(c)}) + base[i+1:]
				if got, want := validTraceParent(s), referenceTraceParent(s); got != want {
					t.Fatalf("validTraceParent(%q) = %v, want %v", s, got, want)
				}
			}
		}
	}
}

func FuzzValidTraceParent(f *testing.F) {
	f.Add(validTP)
	f.Add("ff" + validTP[2:])
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validTraceParent(s), referenceTraceParent(s); got != want {
			t.Fatalf("validTraceParent(%q) = %v, want %v", s, got, want)
		}
	})
}

func BenchmarkValidTraceParent(b *testing.B) {
	for b.Loop() {
		if !validTraceParent(validTP) {
			b.Fatal("invalid")
		}
	}
}
