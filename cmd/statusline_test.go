package cmd

import (
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// fakeTerminal is a screen that understands what a status line sends: "\r" goes back to the start of
// the line, "\033[K" erases from the cursor to the end of the line, "\n" starts a new line.
type fakeTerminal struct {
	mu    sync.Mutex
	lines []string
	col   int
}

func (f *fakeTerminal) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lines == nil {
		f.lines = []string{""}
	}
	s := string(p)
	for len(s) > 0 {
		cur := &f.lines[len(f.lines)-1]
		switch {
		case strings.HasPrefix(s, "\033[K"):
			*cur = (*cur)[:f.col]
			s = s[3:]
		case s[0] == '\r':
			f.col = 0
			s = s[1:]
		case s[0] == '\n':
			f.lines = append(f.lines, "")
			f.col = 0
			s = s[1:]
		default:
			line := []byte(*cur)
			if f.col < len(line) {
				line[f.col] = s[0]
			} else {
				line = append(line, s[0])
			}
			*cur = string(line)
			f.col++
			s = s[1:]
		}
	}
	return len(p), nil
}

func (f *fakeTerminal) screen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.lines...)
}

// TestStatusLineKeepsLinesWhole draws a progress line while the log and a stdout sink write to the
// same screen: every log and output line ends up whole on a line of its own, above the progress.
func TestStatusLineKeepsLinesWhole(t *testing.T) {
	term := &fakeTerminal{}
	status := newStatusLine(term)
	log := slog.New(slog.NewTextHandler(status, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	stdout := status.Output(term)
	write := func(s string) {
		if _, err := io.WriteString(stdout, s); err != nil {
			t.Error(err)
		}
	}

	status.Set("[===       ] 3/10")
	log.Info("first")
	status.Set("[====      ] 4/10")
	write(`{"n":1}` + "\n" + `{"n":`) // a partial line waits for its end
	log.Warn("second")
	write("2}\n")
	want := []string{`level=INFO msg=first`, `{"n":1}`, `level=WARN msg=second`, `{"n":2}`, `[====      ] 4/10`}
	if got := term.screen(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("screen:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	status.Clear()
	if got := term.screen(); got[len(got)-1] != "" {
		t.Fatalf("the status line is still there after Clear: %q", got[len(got)-1])
	}

	// The same, all at once.
	term = &fakeTerminal{}
	status = newStatusLine(term)
	log = slog.New(slog.NewTextHandler(status, nil))
	stdout = status.Output(term)
	const n = 300
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			log.Info("working", "i", i)
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			write(fmt.Sprintf(`{"i":%d}`, i))
			write("\n")
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			line := progress{done: int64(i), total: n, rate: 100}.line()
			status.Set(line)
		}
	}()
	wg.Wait()
	status.Clear()
	logLine := regexp.MustCompile(`^time=\S+ level=INFO msg=working i=\d+$`)
	outLine := regexp.MustCompile(`^\{"i":\d+\}$`)
	logs, outs := 0, 0
	for _, l := range term.screen() {
		switch {
		case logLine.MatchString(l):
			logs++
		case outLine.MatchString(l):
			outs++
		case l != "":
			t.Errorf("a garbled line: %q", l)
		}
	}
	if logs != n || outs != n {
		t.Errorf("%d log lines and %d output lines on the screen, want %d each", logs, outs, n)
	}
}
