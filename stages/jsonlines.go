package stages

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// The file and stdin sources read JSON lines: one message per line, blank lines skipped, and a line
// that is not a JSON object (or is longer than the pipeline's max_message_size) dead-lettered with
// its file and line number.

// NewRunID returns a random name for one run of a source from its beginning, for the IDs of its
// messages (Origin.ID): a source that starts again from scratch is then not taken for a repetition
// of its earlier run by effectively-once delivery.
func NewRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail on supported platforms
	return hex.EncodeToString(b[:])
}

// lineReader says how to read JSON lines: the input's name for errors, the longest line taken, the
// run the lines' IDs name, and (for a file) where reading starts and how to record a position.
type lineReader struct {
	name    string
	maxSize int64
	run     string
	offset  int64 // of the first byte read
	line    int64 // lines before it
	// position returns the position after the line that ends at offset; nil: none.
	position func(offset, line int64) string
}

// line is one line of input, or the error that ended it.
type line struct {
	text []byte // the line; only its start when it is longer than the limit
	size int64  // the line's length, its newline not counted
	read int64  // the bytes it took, its newline counted: 0 at the end of the input
	end  int64  // the offset after it
	err  error
}

// readJSONLines produces a message per line of JSON. Lines are read in a goroutine of their own so
// that a stop does not wait for input that may never come (a terminal); that goroutine ends when
// the input does.
func readJSONLines(ctx context.Context, in io.Reader, lr lineReader, out Emitter) error {
	chunks := make(chan []line, 16)
	go func() {
		defer close(chunks)
		readLines(ctx, bufio.NewReaderSize(in, 64<<10), lr, chunks)
	}()
	n := lr.line
	var id []byte
	for {
		var ls []line
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ls = <-chunks:
		}
		for _, l := range ls {
			if l.read > 0 {
				n++
				id = strconv.AppendInt(append(append(id[:0], lr.run...), ':'), n, 10)
				at := Origin{ID: string(id), File: lr.name, Line: n} // <run>:<line>
				if lr.position != nil {
					at.Position = lr.position(l.end, n)
				}
				if err := emitLine(ctx, out, lr, l, at); err != nil {
					return err
				}
			}
			if errors.Is(l.err, io.EOF) {
				return nil
			}
			if l.err != nil {
				return fmt.Errorf("reading %s: %w", lr.name, l.err)
			}
		}
	}
}

// emitLine passes one line on as a message, or dead-letters it.
func emitLine(ctx context.Context, out Emitter, lr lineReader, l line, at Origin) error {
	if l.size > lr.maxSize {
		err := Permanent(fmt.Errorf("%s:%d: the line is %d bytes long, more than max_message_size (%d bytes)",
			lr.name, at.Line, l.size, lr.maxSize))
		return out.Reject(ctx, err, Message{Value: map[string]any{"line_start": string(l.text)}}, at)
	}
	payload := bytes.TrimSpace(l.text)
	if len(payload) == 0 {
		// A blank line: nothing to send, but a file source's position moves past it with the next
		// line's batch.
		return nil
	}
	if err := CheckPayload(payload); err != nil {
		return out.Reject(ctx, fmt.Errorf("%s:%d: %w", lr.name, at.Line, err),
			Message{Value: map[string]any{"line": string(payload)}}, at)
	}
	// Checked, and the line's own memory (readLines), which nothing modifies.
	return out.Emit(ctx, NewEntryMessage("", payload, nil), at)
}

// LineStartKept is how much of a line or payload over the size limit its dead letter shows.
const LineStartKept = 1024

// linesPerChunk is the most lines readLines sends at once: a channel send per line was a tenth of
// a file source's CPU.
const linesPerChunk = 256

// readLines sends the lines of br to out, each with the offset after it, until the input ends. Of a
// line longer than lr.maxSize no more than the limit is held in memory, and only its first bytes are
// sent on, with its length. Lines go in chunks of what the reader holds already (linesPerChunk at
// most): a chunk is sent before a read that may wait for input (a terminal's next line), so that no
// line waits for the next. The lines that fit the buffer share a few larger allocations.
func readLines(ctx context.Context, br *bufio.Reader, lr lineReader, out chan<- []line) {
	offset := lr.offset
	var chunk []line
	var slab []byte
	for {
		text, err := br.ReadSlice('\n')
		read := int64(len(text))
		if errors.Is(err, bufio.ErrBufferFull) { // a line longer than the buffer
			text = slices.Clone(text)
			for errors.Is(err, bufio.ErrBufferFull) {
				var more []byte
				more, err = br.ReadSlice('\n')
				read += int64(len(more))
				if read <= lr.maxSize+1 { // +1: the newline
					text = append(text, more...)
				}
			}
		} else {
			if cap(slab)-len(slab) < len(text) {
				slab = make([]byte, 0, max(len(text), 64<<10))
			}
			start := len(slab)
			slab = append(slab, text...)
			text = slab[start:len(slab):len(slab)]
		}
		offset += read
		l := line{text: text, size: read, read: read, end: offset, err: err}
		if err == nil { // the line ended with its newline
			l.size--
		}
		if l.size > lr.maxSize {
			l.text = text[:min(len(text), LineStartKept)]
		}
		chunk = append(chunk, l)
		if err != nil || len(chunk) == linesPerChunk || br.Buffered() == 0 {
			select {
			case out <- chunk:
			case <-ctx.Done():
				return
			}
			chunk = nil // the receiver's now
		}
		if err != nil {
			return
		}
	}
}
