package cmd

import (
	"bytes"
	"io"
	"sync"
)

// statusLine shares a terminal between a status line redrawn in place (a job's progress) and
// ordinary lines of output (the log, stdout sinks). Every write goes through it: it clears the
// status line first, writes the output, and draws the status line again below, so that a log line
// is never glued to a half-erased progress line. Writes are serialized; a slog handler writes each
// record with one call, so records are never split.
type statusLine struct {
	mu      sync.Mutex
	term    io.Writer // where the status line is drawn
	status  string
	drawn   bool // the status line is on the screen
	midLine bool // the last output did not end its line: drawing now would overwrite it
	outputs []*statusOutput
}

// clearLine moves to the start of the line and erases it.
const clearLine = "\r\033[K"

// newStatusLine returns a statusLine drawn on term. Use it as the writer of the output that goes to
// term, and Output for other writers that show on the same screen.
func newStatusLine(term io.Writer) *statusLine { return &statusLine{term: term} }

// Write writes output lines to the terminal, above the status line.
func (s *statusLine) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(s.term, p)
}

// Output returns a writer whose output shows on the same screen as the status line (standard output
// on the same terminal): its writes clear the status line and draw it again too. It writes whole
// lines only and holds a partial line back until its end comes (or Clear), since the status line
// drawn after a partial line would overwrite it.
func (s *statusLine) Output(w io.Writer) io.Writer {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := &statusOutput{s: s, w: w}
	s.outputs = append(s.outputs, o)
	return o
}

// maxPartialLine bounds what an Output holds back: a longer line is written as it comes.
const maxPartialLine = 64 << 10

type statusOutput struct {
	s       *statusLine
	w       io.Writer
	partial []byte // the start of a line, not written yet
}

func (o *statusOutput) Write(p []byte) (int, error) {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	o.partial = append(o.partial, p...)
	end := bytes.LastIndexByte(o.partial, '\n') + 1
	if end == 0 {
		if len(o.partial) < maxPartialLine {
			return len(p), nil
		}
		end = len(o.partial)
	}
	_, err := o.s.write(o.w, o.partial[:end])
	o.partial = append(o.partial[:0], o.partial[end:]...)
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// write writes p to w with the status line out of the way; s.mu is held.
func (s *statusLine) write(w io.Writer, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if s.drawn {
		if _, err := io.WriteString(s.term, clearLine); err != nil {
			return 0, err
		}
		s.drawn = false
	}
	n, err := w.Write(p)
	s.midLine = !bytes.HasSuffix(p[:n], []byte("\n"))
	if err == nil {
		s.draw()
	}
	return n, err
}

// Set shows status as the status line, in place of the previous one.
func (s *statusLine) Set(status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = status
	s.draw()
}

// Clear removes the status line, leaving the cursor at the start of an empty line, and writes
// what the outputs held back.
func (s *statusLine) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = ""
	if s.drawn {
		_, _ = io.WriteString(s.term, clearLine)
		s.drawn = false
	}
	for _, o := range s.outputs {
		_, _ = s.write(o.w, o.partial)
		o.partial = o.partial[:0]
	}
}

// draw puts the status line on the screen, unless the last output left its line open; it is drawn
// after the output that ends that line.
func (s *statusLine) draw() {
	if s.status == "" || s.midLine {
		return
	}
	if _, err := io.WriteString(s.term, clearLine+s.status); err == nil {
		s.drawn = true
	}
}
