package stages

import (
	"bytes"
	"errors"
	"testing"
)

// flakyOut takes at most room bytes per write while it fails, then fails.
type flakyOut struct {
	bytes.Buffer
	failing bool
	room    int
}

func (f *flakyOut) Write(p []byte) (int, error) {
	if f.failing {
		n := min(f.room, len(p))
		f.Buffer.Write(p[:n])
		return n, errors.New("no space left on device")
	}
	return f.Buffer.Write(p)
}

// A line writer whose writer failed keeps what the writer did not take and writes it with the next
// flush: no line is dropped or torn, and the buffer works again once the writer does (a bufio.Writer
// would fail every write after its first error).
func TestLineWriterGoesOnAfterAFailedWrite(t *testing.T) {
	out := &flakyOut{failing: true, room: 3}
	b := NewLineWriter(out, 16)
	for _, l := range []string{"one", "two"} {
		if err := b.WriteLine([]byte(l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Flush(); err == nil {
		t.Fatal("the flush of a failing writer succeeded")
	}
	if err := b.WriteLine([]byte("three")); err != nil {
		t.Fatalf("a line that fits the buffer: %v", err)
	}
	if err := b.WriteLine([]byte("a line too long to fit")); err == nil {
		t.Fatal("a line that needs the failing writer was taken")
	}
	out.failing = false
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "one\ntwo\nthree\n"; got != want {
		t.Fatalf("written %q, want %q", got, want)
	}
	if err := b.WriteLine([]byte("four")); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil || out.String() != "one\ntwo\nthree\nfour\n" {
		t.Fatalf("after the writer works again: %q, %v", out.String(), err)
	}
}
