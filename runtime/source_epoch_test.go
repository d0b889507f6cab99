package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestAFileSourceDiesBetweenItsLinesAndTheirCheckpoint: on a cluster, a file source's batch is
// written first and its position recorded after. A process that dies in between has written lines
// whose position nobody recorded; the next one reads them again, from the file's start or from the
// last position recorded. Each line must come out as the same message, in the same partition, so
// that effectively-once writes it once: the source records the run's epoch, at offset 0, before its
// first line (the messages' IDs carry it), and an unkeyed line goes to the partition its ID hashes
// to, not to the next in turn of whichever process reads it.
func TestAFileSourceDiesBetweenItsLinesAndTheirCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name  string
		allow int64 // checkpoints past the start that go through before the process dies
	}{
		{"before its first checkpoint", 0},
		{"after its first checkpoint", 1},
	} {
		t.Run(tc.name, func(t *testing.T) { fileSourceDiesAfter(t, tc.allow) })
	}
}

func fileSourceDiesAfter(t *testing.T, allow int64) {
	const n, batch = 40, 7
	c := cluster.open(t)
	plan := linesToStdout(t, "epoch", n)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	position := keys.SourcePosition("lines")

	// The first process: after allow checkpoints, its next batch is written and the position after
	// it refused for good (as if the process died there); the position at the start, which carries
	// no offset, goes through.
	dying := cluster.open(t)
	f := &checkpointFailer{key: position, allow: allow}
	dying.Universal().AddHook(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log syncBuffer
	_, err := runtime.Run(ctx, plan, runtime.Options{Redis: dying, UntilDrained: true, Nodes: []string{"lines"},
		BatchSize: batch, Stdin: strings.NewReader(""), Logger: newLogger(&log)})
	if err == nil || f.hits.Load() == 0 {
		t.Fatalf("the first run did not fail at its checkpoint (%d refused): %v\n%s", f.hits.Load(), err, log.String())
	}
	if l := totalLength(t, c, keys.Streams("in", 3)); l <= allow*batch {
		t.Fatalf("the first run wrote %d entries, want more than the %d its checkpoints cover (%v)\n%s", l, allow*batch, err, log.String())
	}

	j := runJob(t, c, plan, runtime.Options{})
	if l := totalLength(t, c, keys.Streams("in", 3)); l != n {
		t.Errorf("the topic holds %d entries after the restart, want %d: lines were written again", l, n)
	}
	if got := len(jsonLines(t, j.stdout)); got != n {
		t.Errorf("the sink printed %d messages, want %d", got, n)
	}
}

// linesToStdout builds an effectively-once pipeline named name whose file source reads n lines
// into topic "in" (3 partitions, unkeyed) and whose stdout sink prints them.
func linesToStdout(t *testing.T, name string, n int) *flow.Plan {
	t.Helper()
	dir := t.TempDir()
	var lines strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&lines, "{\"i\":%d}\n", i)
	}
	writeFile(t, filepath.Join(dir, "in.jsonl"), lines.String())
	src := `
pipeline "` + name + `" { delivery = "effectively_once" }
topic "in" { partitions = 3 }
source "lines" {
  kind   = "file"
  path   = "` + filepath.Join(dir, "in.jsonl") + `"
  output = topic.in
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`
	return buildSource(t, src)
}

// totalLength is the sum of the lengths of streams.
func totalLength(t *testing.T, c *redis.Client, streams []string) int64 {
	t.Helper()
	var n int64
	for _, s := range streams {
		n += lengthOf(t, c, s)
	}
	return n
}

// checkpointFailer makes the scripts that record a source's position at key past its start fail,
// after the first allow of them, with an error that ends the run: the process dies there, after
// the batch's lines were written.
type checkpointFailer struct {
	key   string
	allow int64
	seen  atomic.Int64
	hits  atomic.Int64
}

func (f *checkpointFailer) fail(c goredis.Cmder) {
	args := c.Args()
	text := fmt.Sprint(args...)
	if (c.Name() != "eval" && c.Name() != "evalsha") || len(args) < 4 || !slices.Contains(args[3:], any(f.key)) ||
		!strings.Contains(text, `"offset":`) || strings.Contains(text, `"offset":0,`) {
		return
	}
	if f.seen.Add(1) <= f.allow {
		return
	}
	args[0], args[1] = "eval", "return redis.error_reply('NOPERM injected: the process died before its checkpoint')"
	f.hits.Add(1)
}

func (f *checkpointFailer) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (f *checkpointFailer) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, c goredis.Cmder) error {
		f.fail(c)
		return next(ctx, c)
	}
}

func (f *checkpointFailer) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, c := range cmds {
			f.fail(c)
		}
		return next(ctx, cmds)
	}
}
