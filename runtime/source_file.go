package runtime

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// File and stdin sources read JSON lines: one message per line, blank lines skipped, and a line that
// is not a JSON object (or is longer than the pipeline's max_message_size) dead-lettered with its
// file and line number.
//
// A file source records with every batch it writes where the next line starts (its checkpoint, in
// Redis: Keys.SourcePosition), together with a fingerprint of the file's first bytes. A process
// that starts the source again seeks to that position and goes on from there, so that nothing is
// lost and nothing read twice. It starts from the top instead when the file is no longer the one
// it was reading: shorter than the position (truncated or replaced), or with other first bytes, or
// at another path.

// filePosition is a file source's checkpoint.
type filePosition struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"` // where the next line starts
	Line   int64  `json:"line"`   // lines read so far
	// Epoch names this reading of the file from its top (see newEpoch).
	Epoch string `json:"epoch"`
	// Head is a hash of the first HeadLen bytes of the file (fingerprintLen at most, and never
	// past Offset: only what was read is known not to change).
	Head    string `json:"head"`
	HeadLen int    `json:"head_len"`
}

// fingerprintLen is how much of a file's beginning identifies it.
const fingerprintLen = 1024

// headHash returns the fingerprint of a file's first bytes.
func headHash(b []byte) string {
	h := fnv.New64a()
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// readFile returns the produce function of a file source.
func (r *runner) readFile(p *producingSource, path string) func(context.Context, *emitter) error {
	return func(ctx context.Context, e *emitter) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		head := make([]byte, fingerprintLen)
		nh, err := io.ReadFull(f, head)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		head = head[:nh]
		pos, err := r.resumeFile(ctx, p, path, f, head)
		if err != nil {
			return err
		}
		// The head was read already: a fresh start reads it again from memory (the file may be a
		// pipe, which cannot seek), a resumption seeks past it.
		var in io.Reader = io.MultiReader(bytes.NewReader(head), f)
		if pos.Offset > 0 {
			if _, err := f.Seek(pos.Offset, io.SeekStart); err != nil {
				return fmt.Errorf("reading %s: %w", path, err)
			}
			in = f
		}
		e.epoch = pos.Epoch
		lr := lineReader{name: path, maxSize: r.maxMessageSize(), offset: pos.Offset, line: pos.Line}
		lr.position = func(offset, line int64) string {
			pos.Offset, pos.Line = offset, line
			pos.HeadLen = int(min(int64(len(head)), offset))
			pos.Head = headHash(head[:pos.HeadLen])
			b, _ := json.Marshal(pos) // strings and numbers only
			return string(b)
		}
		return readJSONLines(ctx, in, lr, e)
	}
}

// resumeFile returns where a file source starts: its checkpoint, if it has one for this file.
func (r *runner) resumeFile(ctx context.Context, p *producingSource, path string, f *os.File, head []byte) (filePosition, error) {
	fresh := filePosition{Path: path, Epoch: newEpoch()}
	var raw string
	var found bool
	var b backoff
	for {
		var err error
		raw, found, err = r.rdb.ReadCheckpoint(ctx, p.positionKey)
		if err == nil {
			r.outage.ok()
			break
		}
		if redis.Unrecoverable(err) || ctx.Err() != nil {
			return fresh, err
		}
		r.outage.failed("source "+p.node.name+" reading its position", err)
		b.wait(ctx)
	}
	if !found {
		return fresh, nil
	}
	log := r.log.With("source", p.node.name, "path", path)
	var pos filePosition
	if err := json.Unmarshal([]byte(raw), &pos); err != nil {
		log.Warn("the source's recorded position cannot be read; reading the file from the start", "key", p.positionKey, "err", err)
		return fresh, nil
	}
	st, err := f.Stat()
	if err != nil {
		return fresh, fmt.Errorf("reading %s: %w", path, err)
	}
	switch {
	case pos.Path != path:
		log.Info("the source read another file before; reading this one from the start", "before", pos.Path)
		return fresh, nil
	case st.Size() < pos.Offset:
		log.Info("the file is shorter than where the source stopped (it was truncated or replaced); reading it from the start",
			"size", st.Size(), "stopped_at", pos.Offset)
		return fresh, nil
	case pos.HeadLen > len(head) || headHash(head[:pos.HeadLen]) != pos.Head:
		log.Info("the file's first bytes changed since the source read it (it was replaced); reading it from the start")
		return fresh, nil
	}
	if pos.Offset == st.Size() {
		log.Info("the source read the whole file before; resuming at its end", "line", pos.Line, "offset", pos.Offset, "position_key", p.positionKey)
	} else {
		log.Info("resuming where the source stopped", "line", pos.Line+1, "offset", pos.Offset, "position_key", p.positionKey)
	}
	return pos, nil
}

// lineReader says how to read JSON lines: the input's name for errors, the longest line taken, and
// (for a file) where reading starts and how to record a position.
type lineReader struct {
	name    string
	maxSize int64
	offset  int64 // of the first byte read
	line    int64 // lines before it
	// position returns the checkpoint after the line that ends at offset; nil: none.
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
func readJSONLines(ctx context.Context, in io.Reader, lr lineReader, e *emitter) error {
	lines := make(chan line, 256)
	go func() {
		defer close(lines)
		readLines(ctx, bufio.NewReaderSize(in, 64<<10), lr, lines)
	}()
	n := lr.line
	for {
		var l line
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l = <-lines:
		}
		if l.read > 0 {
			n++
			o := origin{seq: n}
			if lr.position != nil {
				o.position = lr.position(l.end, n)
			}
			if err := emitLine(ctx, e, lr, l, o); err != nil {
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

// emitLine passes one line on as a message, or dead-letters it.
func emitLine(ctx context.Context, e *emitter, lr lineReader, l line, o origin) error {
	where := Envelope{File: lr.name, Line: o.seq}
	if l.size > lr.maxSize {
		err := stages.Permanent(fmt.Errorf("%s:%d: the line is %d bytes long, more than max_message_size (%d bytes)",
			lr.name, o.seq, l.size, lr.maxSize))
		return e.reject(ctx, err, stages.Message{Value: map[string]any{"line_start": string(l.text)}}, o, where)
	}
	payload := bytes.TrimSpace(l.text)
	if len(payload) == 0 {
		// A blank line: nothing to send, but a file source's position moves past it with the next
		// line's batch.
		return nil
	}
	if _, err := stages.DecodePayload(payload); err != nil {
		return e.reject(ctx, fmt.Errorf("%s:%d: %w", lr.name, o.seq, err),
			stages.Message{Value: map[string]any{"line": string(payload)}}, o, where)
	}
	return e.emit(ctx, stages.NewMessage("", payload, nil), o)
}

// lineStartKept is how much of a line over the size limit its dead letter shows.
const lineStartKept = 1024

// readLines sends the lines of br to out, each with the offset after it, until the input ends. Of a
// line longer than lr.maxSize no more than the limit is held in memory, and only its first bytes are
// sent on, with its length.
func readLines(ctx context.Context, br *bufio.Reader, lr lineReader, out chan<- line) {
	offset := lr.offset
	for {
		var text []byte
		var read int64
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			read += int64(len(chunk))
			if read <= lr.maxSize+1 { // +1: the newline
				text = append(text, chunk...)
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		offset += read
		l := line{text: text, size: read, read: read, end: offset, err: err}
		if err == nil { // the line ended with its newline
			l.size--
		}
		if l.size > lr.maxSize {
			l.text = text[:min(len(text), lineStartKept)]
		}
		select {
		case out <- l:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}
