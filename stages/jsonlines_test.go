package stages

import (
	"bufio"
	"context"
	"io"
	"testing"
)

// TestReadLinesSendsWhatItHoldsBeforeWaiting: lines go in chunks, but a chunk is sent before a
// read that waits for more input (a terminal's next line), and the lines of a chunk, which share
// memory, do not write over each other when one is appended to.
func TestReadLinesSendsWhatItHoldsBeforeWaiting(t *testing.T) {
	in, feed := io.Pipe()
	defer in.Close()
	out := make(chan []line, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go readLines(ctx, bufio.NewReaderSize(in, 64<<10), lineReader{maxSize: 1 << 20}, out)

	go func() { _, _ = io.WriteString(feed, "{\"a\":1}\n{\"b\":2}\n") }()
	var got []line
	for len(got) < 2 { // with nothing more written: were they held for more, this would not end
		got = append(got, <-out...)
	}
	if string(got[0].text) != "{\"a\":1}\n" || string(got[1].text) != "{\"b\":2}\n" || got[1].end != 16 {
		t.Fatalf("got %q and %q (ending at %d)", got[0].text, got[1].text, got[1].end)
	}
	_ = append(got[0].text, "overwritten"...)
	if string(got[1].text) != "{\"b\":2}\n" {
		t.Fatalf("appending to the first line changed the second: %q", got[1].text)
	}

	go func() { _, _ = io.WriteString(feed, "{\"c\":3}"); feed.Close() }()
	last := <-out
	if len(last) != 1 || string(last[0].text) != "{\"c\":3}" || last[0].err != io.EOF {
		t.Fatalf("the last line: %+v", last)
	}
}
