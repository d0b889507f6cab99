package stages

import (
	"io"
	"sync"
)

// LineWriter buffers lines for a writer and is safe for concurrent use, so that the lines of
// different partitions and sinks never interleave. Unlike a bufio.Writer, whose first error sticks
// and fails every later write, it keeps what a failed write did not take and writes it with the next
// flush: a sink whose output failed for a while (a full disk) goes on once it works again, and the
// lines that other batches left in the buffer are never dropped. A batch whose flush failed is
// delivered again, so its lines may come out twice.
type LineWriter struct {
	mu   sync.Mutex
	w    io.Writer
	buf  []byte
	size int // the buffer is written out before it grows past size
}

// NewLineWriter returns a LineWriter that writes to w in chunks of about size bytes.
func NewLineWriter(w io.Writer, size int) *LineWriter {
	return &LineWriter{w: w, size: size}
}

// WriteLine adds a line and its newline. When the buffer is full and cannot be written out, the
// line is not added: its delivery failed.
func (b *LineWriter) WriteLine(line []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) > 0 && len(b.buf)+len(line)+1 > b.size {
		if err := b.flush(); err != nil {
			return err
		}
	}
	b.buf = append(b.buf, line...)
	b.buf = append(b.buf, '\n')
	return nil
}

// Flush writes out what the buffer holds; what a failed write did not take stays for the next.
func (b *LineWriter) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flush()
}

func (b *LineWriter) flush() error {
	if len(b.buf) == 0 {
		return nil
	}
	n, err := b.w.Write(b.buf)
	n = min(max(n, 0), len(b.buf))
	if err == nil && n < len(b.buf) {
		err = io.ErrShortWrite
	}
	b.buf = b.buf[:copy(b.buf, b.buf[n:])]
	if err == nil && cap(b.buf) > 4*b.size {
		b.buf = nil // a very long line passed: do not keep its memory
	}
	return err
}
