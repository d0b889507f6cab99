package runtime_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
)

// The edges of a pipeline: sources that write into it while Redis goes away, sinks whose
// downstream goes away, and what the user sees meanwhile.

// sourcePipeline reads numbered messages from a source of the given kind ("generate" makes n of
// them) into a keyed topic, and copies them to the stream out.
func sourcePipeline(prefix, kind, delivery, out string, n int) string {
	var src string
	switch kind {
	case "generate":
		src = fmt.Sprintf(`kind  = "generate"
  count = %d
  rate  = 4000
  template = {
    i = index
    k = "k${index %% 40}"
  }`, n)
	case "file":
		src = `kind = "file"
  path = var.path`
	case "stdin":
		src = `kind = "stdin"`
	}
	return fmt.Sprintf(`
pipeline "edges" {
  key_prefix = %q
  delivery   = %q
}
variable "path" {
  type    = string
  default = ""
}
topic "in" {
  partitions = 4
  key        = msg.k
}
source "src" {
  %s
  output = topic.in
}
sink "out" {
  kind   = "redis_stream"
  input  = topic.in
  stream = %q
}
`, prefix, delivery, src, out)
}

// numberedLines writes the JSON lines of messages from..to-1 to w.
func numberedLines(w io.Writer, from, to int) error {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "{\"i\":%d,\"k\":\"k%d\"}\n", i, i%40)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// TestSourcesWaitThroughARedisOutage shuts Redis down for 2s while each kind of producing source is
// in the middle of its input, and starts it again (with its AOF): the source waits, logs the
// outage once, loses nothing, and the job ends by itself. With effectively_once nothing arrives
// twice; with at_least_once a batch whose reply was lost may.
func TestSourcesWaitThroughARedisOutage(t *testing.T) {
	const n, firstPart = 8000, 2000
	for _, kind := range []string{"generate", "file", "stdin"} {
		for _, delivery := range []string{"at_least_once", "effectively_once"} {
			t.Run(kind+"/"+delivery, func(t *testing.T) {
				t.Parallel()
				srv := redistest.Start(t, redistest.WithAOF())
				c := openURLs(t, srv.URL())
				prefix := fmt.Sprintf("outage-%d", prefixes.Add(1))
				out := prefix + ":out"
				// The input of file and stdin sources is fed by the test: a first part, then the
				// rest once Redis is down, so that the source has to wait mid-stream.
				var input io.WriteCloser
				var stdin io.Reader
				var vars []string
				switch kind {
				case "file":
					path := filepath.Join(t.TempDir(), "in.jsonl")
					if err := syscall.Mkfifo(path, 0o600); err != nil {
						t.Fatal(err)
					}
					vars = append(vars, "path="+path)
					opened := make(chan *os.File, 1)
					go func() {
						f, err := os.OpenFile(path, os.O_WRONLY, 0)
						if err != nil {
							t.Error(err)
						}
						opened <- f
					}()
					defer func() {
						if f := <-opened; f != nil {
							f.Close()
						}
					}()
					input = fifoWriter{opened: opened}
				case "stdin":
					pr, pw := io.Pipe()
					stdin, input = pr, pw
				}
				plan := buildSource(t, sourcePipeline(prefix, kind, delivery, out, n), vars...)
				var log syncBuffer
				rt, err := runtime.New(plan, runtime.Options{
					Redis: openURLs(t, srv.URL()), UntilDrained: true, Stdin: stdin, Logger: newLogger(&log),
				})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				done := make(chan error, 1)
				var summary *runtime.Summary
				go func() {
					var err error
					summary, err = rt.Run(ctx)
					done <- err
				}()
				rest := make(chan struct{})
				fed := make(chan error, 1)
				if input != nil {
					go func() {
						err := numberedLines(input, 0, firstPart)
						<-rest
						if err == nil {
							err = numberedLines(input, firstPart, n)
						}
						fed <- err
						input.Close()
					}()
				}

				waitFor(t, "the first messages to arrive", func() bool { return len(arrivals(t, c, out)) >= firstPart/2 })
				srv.Stop()
				close(rest)
				waitFor(t, "Redis to have been down for 2s, as the runtime sees it", func() bool {
					since := rt.Snapshot().RedisFailingSince
					return !since.IsZero() && time.Since(since) >= 2*time.Second
				})
				if p := rt.Snapshot().Sources[0].Produced; p >= n {
					t.Fatalf("the source had written all %d messages before Redis went down: nothing was tested", p)
				}
				srv.Start(t)
				if err := <-done; err != nil {
					t.Fatalf("the job: %v\n%s", err, log.String())
				}
				if input != nil {
					if err := <-fed; err != nil {
						t.Fatal(err)
					}
				}
				dups := tally(t, arrivals(t, c, out), n)
				src := summaryNode(summary, "src")
				t.Logf("%s, %s: %d messages, %d duplicated; the source counted %d written", kind, delivery, n, dups, src.Out)
				if src.Out != n || src.DeadLettered != 0 {
					t.Errorf("the source counted %d written and %d dead-lettered, want %d and 0", src.Out, src.DeadLettered, n)
				}
				if delivery == "effectively_once" && dups > 0 {
					t.Errorf("%d duplicates with effectively_once", dups)
				}
				if dups > 2*1000 {
					t.Errorf("%d duplicates: more than the batches a lost reply can repeat", dups)
				}
				if os.Getenv("SHOW_LOG") != "" {
					t.Log(log.String())
				}
				if warned := strings.Count(log.String(), "Redis is failing"); warned != 1 {
					t.Errorf("the outage was reported %d times, want once:\n%s", warned, log.String())
				}
			})
		}
	}
}

// summaryNode returns a node's counts from a summary.
func summaryNode(s *runtime.Summary, name string) runtime.NodeSummary {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n
		}
	}
	return runtime.NodeSummary{}
}

// fifoWriter writes to a named pipe once its other end is open.
type fifoWriter struct{ opened chan *os.File }

func (w fifoWriter) Write(p []byte) (int, error) {
	f := <-w.opened
	defer func() { w.opened <- f }()
	return f.Write(p)
}

func (w fifoWriter) Close() error {
	f := <-w.opened
	defer func() { w.opened <- nil }()
	return f.Close()
}
