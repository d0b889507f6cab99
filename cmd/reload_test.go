package cmd

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
)

// watchedPipeline is the pipeline TestRunWatchReloads edits while it runs: version is what tag
// stamps on each message.
func watchedPipeline(version string) string {
	return `pipeline "watched" {}
topic "in" { partitions = 2 }
source "gen" {
  kind     = "generate"
  rate     = 50
  output   = topic.in
  template = { n = index }
}
stage "tag" {
  kind  = "map"
  input = topic.in
  set   = { v = ` + version + ` }
}
sink "out" {
  kind  = "stdout"
  input = stage.tag
}
`
}

// TestRunWatchReloads runs a service with --watch and edits its file: a change with an error is
// refused with the diagnostic, located as validate locates it, and the service goes on with the old
// definition; a valid change is applied, and the messages show the new definition.
func TestRunWatchReloads(t *testing.T) {
	path := writePipeline(t, watchedPipeline("1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, errOut := newLineWriter(), newLineWriter()
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"run", path, "--redis", redistest.Shared(t).URL(), "--watch", "--watch-interval", "20ms"},
			IO{In: strings.NewReader(""), Out: out, Err: errOut})
	}()
	waitForLine(t, out, `"v":1`)

	edit := func(src string) {
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit(strings.Replace(watchedPipeline("1"), "input = stage.tag", "input = stage.tga", 1))
	waitForLine(t, errOut, "on "+path+" line 16")
	waitForLine(t, errOut, "reload refused: the pipeline has errors")
	drain(out)
	waitForLine(t, out, `"v":1`) // the old definition goes on

	edit(watchedPipeline("2"))
	waitForLine(t, errOut, "reload applied")
	waitForLine(t, out, `"v":2`)
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("exit %d", code)
	}
}

// TestRunReloadsOnSIGHUP: without --watch, a service reloads its files on SIGHUP.
func TestRunReloadsOnSIGHUP(t *testing.T) {
	path := writePipeline(t, watchedPipeline("1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, errOut := newLineWriter(), newLineWriter()
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"run", path, "--redis", redistest.Shared(t).URL()},
			IO{In: strings.NewReader(""), Out: out, Err: errOut})
	}()
	waitForLine(t, out, `"v":1`) // the service runs: its reloader listens for SIGHUP
	if err := os.WriteFile(path, []byte(watchedPipeline("2")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitForLine(t, errOut, "reload applied")
	drain(out)
	waitForLine(t, out, `"v":2`)
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("exit %d", code)
	}
}

// waitForLine waits for a line that contains what.
func waitForLine(t *testing.T, w *lineWriter, what string) string {
	t.Helper()
	var seen []string
	for {
		l := w.next(t)
		if strings.Contains(l, what) {
			return l
		}
		if seen = append(seen, l); len(seen) > 5000 {
			t.Fatalf("no line with %q among:\n%s", what, strings.Join(seen[len(seen)-20:], "\n"))
		}
	}
}

// drain forgets the lines written so far.
func drain(w *lineWriter) {
	for {
		select {
		case <-w.lines:
		default:
			return
		}
	}
}
