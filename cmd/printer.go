package cmd

import (
	"fmt"
	"io"
)

// printer writes a command's output line by line and keeps the first error, which the command
// returns once it has printed everything: a standard output that was closed or a full disk ends
// the command with an error instead of a silently short output. After an error it writes nothing.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) println(args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintln(p.w, args...)
	}
}

// note writes a message for people to w, a command's standard error. An error writing it is
// ignored: stderr has nowhere better to report to, and what the command does does not depend on
// whether its notes were read.
func note(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format, args...)
}
