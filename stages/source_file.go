package stages

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"strconv"

	"github.com/flowrun/flowrun/flow"
)

// The file source's attributes.
const (
	fileSourceFieldPath = "path"
)

// The file source reads a file of JSON lines (see jsonlines.go), one message per line, and ends at
// the end of the file.
//
// It records with every batch it writes where the next line starts (its position), together with a
// fingerprint of the file's first bytes. A process that starts the source again seeks to that
// position and goes on from there, so that nothing is lost and nothing read twice. It starts from
// the top instead when the file is no longer the one it was reading: shorter than the position
// (truncated or replaced), or with other first bytes, or at another path.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "file",
			Doc:  "Reads a file of JSON lines, one message per line, and ends at the end of the file.",
			Attributes: []flow.Attribute{
				{Name: fileSourceFieldPath, Type: flow.TypeString, Required: true, Doc: "The file to read; a relative path is relative to the working directory (use path.pipeline for files next to the pipeline)."},
			},
			Example: `source "orders_file" {
  kind   = "file"
  path   = "${path.pipeline}/data/orders.jsonl"
  output = topic.orders
}`,
		},
		Traits: SourceTraits{Resumes: true},
		New: func(s *flow.Source, env Env) (Source, error) {
			return &fileSource{path: s.Config.String(fileSourceFieldPath), env: env}, nil
		},
	})
}

type fileSource struct {
	path string
	env  Env
}

// filePosition is a file source's position.
type filePosition struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"` // where the next line starts
	Line   int64  `json:"line"`   // lines read so far
	// Epoch names this reading of the file from its top (see NewRunID).
	Epoch string `json:"epoch"`
	// Head is a hash of the first HeadLen bytes of the file (fingerprintLen at most, and never
	// past Offset: only what was read is known not to change).
	Head    string `json:"head"`
	HeadLen int    `json:"head_len"`
}

// appendJSON appends the position as encoding/json encodes it, but for HTML characters in the
// path, left as they are (json.Unmarshal reads both alike). A position is made for every line:
// json.Marshal's reflection was a tenth of a file source's CPU.
func (p *filePosition) appendJSON(b []byte) []byte {
	return p.appendAfterLine(appendOffsetAndLine(p.appendStart(b), p.Offset, p.Line))
}

// appendStart appends the position's JSON up to its offset.
func (p *filePosition) appendStart(b []byte) []byte {
	b = append(b, `{"path":`...)
	b = appendString(b, p.Path)
	return append(b, `,"offset":`...)
}

// appendOffsetAndLine appends a position's offset and line, after its start.
func appendOffsetAndLine(b []byte, offset, line int64) []byte {
	b = strconv.AppendInt(b, offset, 10)
	b = append(b, `,"line":`...)
	return strconv.AppendInt(b, line, 10)
}

// appendAfterLine appends the rest of the position's JSON.
func (p *filePosition) appendAfterLine(b []byte) []byte {
	b = append(b, `,"epoch":`...)
	b = appendString(b, p.Epoch)
	b = append(b, `,"head":`...)
	b = appendString(b, p.Head)
	b = append(b, `,"head_len":`...)
	b = strconv.AppendInt(b, int64(p.HeadLen), 10)
	return append(b, '}')
}

// positionEncoder encodes the positions of one reading of a file, one per line. They differ from
// line to line in their offset and line, and in their head only within the file's first bytes:
// the path, epoch and head are encoded once, not escaped again for every line.
type positionEncoder struct {
	pos       filePosition
	head      []byte // the file's first bytes
	wholeHead string // headHash(head): the head of every position past them
	start     []byte // pos.appendStart
	after     []byte // pos.appendAfterLine, for pos.HeadLen
	buf       []byte
}

func newPositionEncoder(pos filePosition, head []byte) *positionEncoder {
	e := &positionEncoder{pos: pos, head: head, wholeHead: headHash(head), start: pos.appendStart(nil)}
	e.pos.HeadLen = -1 // none encoded yet
	return e
}

// encode returns the position after the line that ends at offset, the line'th.
func (e *positionEncoder) encode(offset, line int64) string {
	if headLen := int(min(int64(len(e.head)), offset)); headLen != e.pos.HeadLen {
		e.pos.HeadLen, e.pos.Head = headLen, e.wholeHead
		if headLen < len(e.head) {
			e.pos.Head = headHash(e.head[:headLen])
		}
		e.after = e.pos.appendAfterLine(e.after[:0])
	}
	e.buf = append(appendOffsetAndLine(append(e.buf[:0], e.start...), offset, line), e.after...)
	return string(e.buf)
}

// fingerprintLen is how much of a file's beginning identifies it.
const fingerprintLen = 1024

// headHash returns the fingerprint of a file's first bytes.
func headHash(b []byte) string {
	h := fnv.New64a()
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func (s *fileSource) Produce(ctx context.Context, out Emitter) error {
	f, err := os.Open(s.path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // read only: closing loses nothing
	head := make([]byte, fingerprintLen)
	nh, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return fmt.Errorf("reading %s: %w", s.path, err)
	}
	head = head[:nh]
	pos, err := s.resume(ctx, out, f, head)
	if err != nil {
		return err
	}
	// The head was read already: a fresh start reads it again from memory (the file may be a
	// pipe, which cannot seek), a resumption seeks past it.
	in := io.MultiReader(bytes.NewReader(head), f)
	if pos.Offset > 0 {
		if _, err := f.Seek(pos.Offset, io.SeekStart); err != nil {
			return fmt.Errorf("reading %s: %w", s.path, err)
		}
		in = f
	}
	lr := lineReader{name: s.path, maxSize: s.env.MaxMessageSize, offset: pos.Offset, line: pos.Line, run: pos.Epoch}
	lr.position = newPositionEncoder(pos, head).encode
	if pos.Offset == 0 && pos.Line == 0 {
		// A fresh start: its epoch, which its messages' IDs carry, is recorded before them.
		if err := out.Record(ctx, lr.position(0, 0)); err != nil {
			return err
		}
	}
	return readJSONLines(ctx, in, lr, out)
}

// resume returns where the source starts: its recorded position, if it has one for this file.
func (s *fileSource) resume(ctx context.Context, out Emitter, f *os.File, head []byte) (filePosition, error) {
	fresh := filePosition{Path: s.path, Epoch: NewRunID()}
	raw, found, err := out.Resume(ctx)
	if err != nil || !found {
		return fresh, err
	}
	log := s.env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("path", s.path)
	var pos filePosition
	if err := json.Unmarshal([]byte(raw), &pos); err != nil {
		log.Warn("the source's recorded position cannot be read; reading the file from the start", "err", err)
		return fresh, nil
	}
	st, err := f.Stat()
	if err != nil {
		return fresh, fmt.Errorf("reading %s: %w", s.path, err)
	}
	switch {
	case pos.Path != s.path:
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
		log.Info("the source read the whole file before; resuming at its end", "line", pos.Line, "offset", pos.Offset)
	} else {
		log.Info("resuming where the source stopped", "line", pos.Line+1, "offset", pos.Offset)
	}
	return pos, nil
}
