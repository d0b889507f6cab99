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
	"unsafe"

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

// encode is json.Marshal(p), written without reflection: a position is made for every line (5 %
// of Nexmark q0's CPU through encoding/json). TestFilePositionEncodesAsEncodingJSON compares them.
func (p filePosition) encode() string {
	b := make([]byte, 0, 96+len(p.Path)+len(p.Epoch)+len(p.Head))
	b = appendJSONString(append(b, `{"path":`...), p.Path)
	b = strconv.AppendInt(append(b, `,"offset":`...), p.Offset, 10)
	b = strconv.AppendInt(append(b, `,"line":`...), p.Line, 10)
	b = appendJSONString(append(b, `,"epoch":`...), p.Epoch)
	b = appendJSONString(append(b, `,"head":`...), p.Head)
	b = strconv.AppendInt(append(b, `,"head_len":`...), int64(p.HeadLen), 10)
	b = append(b, '}')
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// appendJSONString appends s as encoding/json writes a string: as it is, between quotes, when it is
// printable ASCII that needs no escape (HTML's <, > and & included), through encoding/json
// otherwise.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
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
	wholeHead := headHash(head) // every line's past the head but the first few has this one
	lr.position = func(offset, line int64) string {
		pos.Offset, pos.Line = offset, line
		pos.HeadLen = int(min(int64(len(head)), offset))
		pos.Head = wholeHead
		if pos.HeadLen < len(head) {
			pos.Head = headHash(head[:pos.HeadLen])
		}
		return pos.encode()
	}
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
