package cmd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flowrun/internal/redistest"
)

// The tests that need Redis share one redis-server (and one 3-master cluster) per test binary;
// each isolates itself with a pipeline whose key prefix is unique to it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }

// runIn executes the command line with stdin as standard input.
func runIn(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Execute(testContext(t), args, IO{In: strings.NewReader(stdin), Out: &out, Err: &errOut})
	return code, out.String(), errOut.String()
}

// testContext bounds a test's Redis calls, so that a hang fails the test instead of the binary.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var (
	runs        atomic.Int64
	nonKeyChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)
)

// testPipeline writes a pipeline of the given blocks whose key prefix is unique to the test (and
// to this run of it, for -count), and returns its path and key prefix.
func testPipeline(t *testing.T, blocks string) (path, prefix string) {
	t.Helper()
	n := runs.Add(1)
	prefix = fmt.Sprintf("t%d:%s", n, strings.Trim(nonKeyChars.ReplaceAllString(t.Name(), "-"), "-"))
	src := fmt.Sprintf("pipeline \"p%d\" {\n  key_prefix = %q\n}\n\n%s", n, prefix, blocks)
	path = filepath.Join(t.TempDir(), "p.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, prefix
}

// ordersPipeline has a keyed topic with 3 partitions read by a stage, and an unkeyed topic with 2.
const ordersPipeline = `
topic "orders" {
  partitions = 3
  key        = msg.customer_id
}

topic "events" { partitions = 2 }
topic "failed" { partitions = 1 }

stage "enrich" {
  kind        = "map"
  input       = topic.orders
  output      = topic.events
  dead_letter = topic.failed
  set = {
    seen = true
  }
}

sink "audit" {
  kind  = "stdout"
  input = topic.events
}

sink "failures" {
  kind  = "stdout"
  input = topic.failed
}
`

// lineWriter collects output and hands over each complete line as it is written, so that a
// test can wait for output instead of sleeping.
type lineWriter struct {
	mu      sync.Mutex
	partial []byte
	lines   chan string
}

func newLineWriter() *lineWriter { return &lineWriter{lines: make(chan string, 1000)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- string(w.partial[:i])
		w.partial = w.partial[i+1:]
	}
}

// next waits for the next line.
func (w *lineWriter) next(t *testing.T) string {
	t.Helper()
	select {
	case l := <-w.lines:
		return l
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for a line of output")
		return ""
	}
}
