package stages

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/flowrun/flowrun/flow"
)

// The file sink's attributes, and the values of mode.
const (
	fileSinkFieldPath    = "path"
	fileSinkFieldMode    = "mode"
	fileSinkModeAppend   = "append"
	fileSinkModeTruncate = "truncate"
)

// The file sink appends each message's payload as a line of JSON to a file, and syncs the file
// before the batch is acknowledged, so that an acknowledged message is on disk.
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "file",
			Doc: "Appends each message as a line of JSON to a file, and syncs the file before it acknowledges " +
				"a batch. The file and the directories above it are created when missing.",
			Attributes: []flow.Attribute{
				{Name: fileSinkFieldPath, Type: flow.TypeString, Required: true, Doc: "The file to write to; a relative path is relative to the working directory."},
				{
					Name: fileSinkFieldMode, Type: flow.TypeString, Default: fileSinkModeAppend, Enum: []string{fileSinkModeAppend, fileSinkModeTruncate},
					Doc: "append adds to what the file holds; truncate empties it once, when the run starts, for a " +
						"job whose output replaces the last run's. Every process that runs the sink empties it " +
						"when it starts, so a pipeline shared by processes on one machine appends.",
				},
			},
			Example: `sink "archive" {
  kind  = "file"
  input = topic.clean
  path  = var.output_path
  mode  = "truncate"
}`,
		},
		Traits: SinkTraits{Inline: true},
		New: func(s *flow.Sink, _ Env) (Sink, error) {
			return &fileSink{path: s.Config.String(fileSinkFieldPath), truncate: s.Config.String(fileSinkFieldMode) == fileSinkModeTruncate}, nil
		},
	})
}

type fileSink struct {
	path     string
	truncate bool // empty the file when the run opens it (mode = "truncate")
	f        *os.File
	w        *LineWriter
	synced   groupSync
}

func (s *fileSink) Open(context.Context) error {
	// A job's output often goes to a directory of its own that nothing has made yet.
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_APPEND | os.O_CREATE
	if s.truncate {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(s.path, flags, 0o644)
	if err != nil {
		return err
	}
	s.f, s.w = f, NewLineWriter(f, 64<<10)
	return nil
}

func (s *fileSink) Deliver(_ context.Context, m *Message, out []Write) ([]Write, error) {
	payload, err := m.Payload()
	if err != nil {
		return out, err
	}
	return out, s.w.WriteLine(payload)
}

func (s *fileSink) Flush(context.Context) error {
	if err := s.w.Flush(); err != nil {
		return err
	}
	return s.synced.sync(s.f.Sync)
}

// groupSync syncs a file for the batches of every partition of a sink, which share it: a batch
// whose lines were written while another batch's sync ran waits for it, and the batches that
// waited meanwhile share the next sync, which starts after all of their writes and so covers them
// all. A sync per batch was a twentieth of a pass-through job's CPU.
type groupSync struct {
	written atomic.Uint64 // flushes whose writes are done, numbered from 1
	mu      sync.Mutex    // held while syncing
	synced  uint64        // the flushes that a sync, started after them, made durable
}

// sync makes the caller's writes, done, durable: by a sync of its own, or by one that started
// after them. A failed sync covers nothing: each of its waiters then syncs again.
func (g *groupSync) sync(syncFile func() error) error {
	mine := g.written.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.synced >= mine {
		return nil
	}
	covers := g.written.Load() // writes done before the sync starts, ours among them
	if err := syncFile(); err != nil {
		return err
	}
	g.synced = covers
	return nil
}

func (s *fileSink) Close() error {
	if s.f == nil {
		return nil
	}
	err := s.Flush(context.Background())
	return errors.Join(err, s.f.Close())
}
