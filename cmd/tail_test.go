package cmd

import (
	"context"
	"fmt"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

func xadd(t *testing.T, rdb goredis.UniversalClient, stream string, values ...any) string {
	t.Helper()
	id, err := rdb.XAdd(testContext(t), &goredis.XAddArgs{Stream: stream, Values: values}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestTailFollow(t *testing.T) {
	srv := redistest.Shared(t)
	path, prefix := testPipeline(t, ordersPipeline)
	keys := redis.Keys{Prefix: prefix}
	rdb := srv.Client(t)
	first := xadd(t, rdb, keys.Stream("events", 1), "payload", `{"n":1}`, "key", "k1")

	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	out := newLineWriter()
	var errOut strings.Builder
	done := make(chan int)
	go func() {
		done <- Execute(ctx, []string{"tail", "--follow", "--redis", srv.URL(), path, "events"}, IO{In: strings.NewReader(""), Out: out, Err: &errOut})
	}()

	// The entry already there, then one added while tail waits, in the other partition.
	l := parseTail(t, out.next(t))
	if len(l) != 1 || l[0].ID != first || l[0].Partition != 1 || l[0].Key != "k1" || string(l[0].Payload) != `{"n":1}` {
		t.Fatalf("first line: %+v", l)
	}
	second := xadd(t, rdb, keys.Stream("events", 0), "payload", `{"n":2}`, "headers", `{"h":"v"}`)
	l = parseTail(t, out.next(t))
	if len(l) != 1 || l[0].ID != second || l[0].Partition != 0 || l[0].Key != "" || l[0].Headers["h"] != "v" {
		t.Fatalf("second line: %+v", l)
	}
	// And a malformed entry, which is printed with its error instead of stopping tail.
	third := xadd(t, rdb, keys.Stream("events", 1), "payload", `{broken`)
	l = parseTail(t, out.next(t))
	if len(l) != 1 || l[0].ID != third || l[0].Error != "payload is not valid JSON" || l[0].Fields["payload"] != "{broken" || l[0].Payload != nil {
		t.Fatalf("malformed line: %+v", l)
	}

	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("tail --follow after cancel: exit %d\n%s", code, errOut.String())
	}
	select {
	case extra := <-out.lines:
		t.Fatalf("unexpected output %q", extra)
	default:
	}
}

func TestTailFollowCount(t *testing.T) {
	srv := redistest.Shared(t)
	path, prefix := testPipeline(t, ordersPipeline)
	keys := redis.Keys{Prefix: prefix}
	rdb := srv.Client(t)
	xadd(t, rdb, keys.Stream("events", 0), "payload", `{"n":1}`)
	out := newLineWriter()
	done := make(chan int)
	go func() {
		done <- Execute(testContext(t), []string{"tail", "-f", "-n", "2", "--redis", srv.URL(), path, "events"},
			IO{In: strings.NewReader(""), Out: out, Err: out})
	}()
	out.next(t)
	xadd(t, rdb, keys.Stream("events", 1), "payload", `{"n":2}`)
	out.next(t)
	// Two lines printed: tail stops by itself.
	if code := <-done; code != ExitOK {
		t.Fatalf("exit %d", code)
	}
}

func TestTailFromAndCount(t *testing.T) {
	srv := redistest.Shared(t)
	path, prefix := testPipeline(t, ordersPipeline)
	keys := redis.Keys{Prefix: prefix}
	rdb := srv.Client(t)
	var ids []string
	for i := range 6 {
		ids = append(ids, xadd(t, rdb, keys.Stream("events", i%2), "payload", `{}`))
	}
	// A flat entry written by another application: its fields are the payload.
	ids = append(ids, xadd(t, rdb, keys.Stream("events", 0), "type", "click", "key", "not-a-key"))
	url := srv.URL()

	// --from applies to every partition: entries after that ID, wherever they are.
	_, out, _ := runIn(t, "", "tail", "--redis", url, "--from", ids[3], path, "events")
	var want []string
	for _, id := range ids {
		if c, _ := redis.CompareIDs(id, ids[3]); c > 0 {
			want = append(want, id)
		}
	}
	lines := parseTail(t, out)
	if len(lines) != len(want) {
		t.Fatalf("--from %s printed %d lines, want %v:\n%s", ids[3], len(lines), want, out)
	}
	var flat *tailLine
	for i, l := range lines {
		if c, _ := redis.CompareIDs(l.ID, ids[3]); c <= 0 {
			t.Fatalf("--from %s printed %s", ids[3], l.ID)
		}
		// Merged in ID order. Two partitions can hold the same ID (each stream numbers its
		// entries within a millisecond), so the flat entry, written last, need not be printed last.
		if i > 0 {
			if c, _ := redis.CompareIDs(lines[i-1].ID, l.ID); c > 0 {
				t.Fatalf("%s printed before %s", lines[i-1].ID, l.ID)
			}
		}
		if l.Partition == 0 && l.ID == ids[6] {
			flat = &lines[i]
		}
	}
	if flat == nil || string(flat.Payload) != `{"key":"not-a-key","type":"click"}` || flat.Key != "" {
		t.Fatalf("flat entry: %+v", flat)
	}
	_, out, _ = runIn(t, "", "tail", "--redis", url, "--count", "2", path, "events")
	if lines := parseTail(t, out); len(lines) != 2 || lines[0].ID != ids[0] || lines[1].ID != ids[1] && lines[1].ID != ids[2] {
		t.Fatalf("--count 2: %s", out)
	}
	if code, out, _ := runIn(t, "", "tail", "--redis", url, "--from", "$", path, "events"); code != ExitOK || out != "" {
		t.Fatalf("--from $ without --follow: exit %d, %q", code, out)
	}
	// A topic nobody has written to is empty, not an error.
	if code, out, errOut := runIn(t, "", "tail", "--redis", url, path, "failed"); code != ExitOK || out != "" {
		t.Fatalf("empty topic: exit %d, %q\n%s", code, out, errOut)
	}
}

func TestTailUsageErrors(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	path, _ := testPipeline(t, ordersPipeline)
	for _, args := range [][]string{
		{"tail", "--from", "yesterday", path, "events"},
		{"tail", "--count", "-1", path, "events"},
		{"tail", path},
	} {
		if code, _, errOut := runIn(t, "", args...); code != ExitInvalid {
			t.Errorf("%v: exit %d\n%s", args, code, errOut)
		}
	}
}

// Partitions live on different masters of a cluster: produce, tail and inspect must reach them all.
func TestProduceTailInspectOnACluster(t *testing.T) {
	cl := redistest.SharedCluster(t, 3)
	path, _ := testPipeline(t, ordersPipeline)
	args := func(cmd ...string) []string {
		var a []string
		for _, u := range cl.URLs() {
			a = append(a, "--redis", u)
		}
		return append(append([]string{cmd[0]}, a...), cmd[1:]...)
	}
	code, _, errOut := runIn(t, orderLines(40, 9), args("produce", path, "orders")...)
	if code != ExitOK || !strings.Contains(errOut, "published 40 messages") {
		t.Fatalf("produce: exit %d\n%s", code, errOut)
	}
	code, out, errOut := runIn(t, "", args("tail", path, "orders")...)
	if code != ExitOK {
		t.Fatalf("tail: exit %d\n%s", code, errOut)
	}
	lines := parseTail(t, out)
	if len(lines) != 40 {
		t.Fatalf("tail printed %d lines, want 40", len(lines))
	}
	checkPartitionOrder(t, lines, 3)

	// --follow on a cluster: one blocked reader per partition, ended by --count.
	outW := newLineWriter()
	done := make(chan int)
	go func() {
		done <- Execute(testContext(t), args("tail", "--follow", "--count", "2", path, "events"),
			IO{In: strings.NewReader(""), Out: outW, Err: outW})
	}()
	for i := range 2 {
		// The second message is published after tail printed the first, so tail is following.
		if code, _, errOut := runIn(t, fmt.Sprintf(`{"seq":%d}`, i), args("produce", path, "events")...); code != ExitOK {
			t.Fatalf("produce events: exit %d\n%s", code, errOut)
		}
		if l := parseTail(t, outW.next(t)); len(l) != 1 || string(l[0].Payload) != fmt.Sprintf(`{"seq":%d}`, i) {
			t.Fatalf("followed %+v", l)
		}
	}
	if code := <-done; code != ExitOK {
		t.Fatalf("tail --follow: exit %d", code)
	}

	code, out, errOut = runIn(t, "", args("inspect", "--json", path)...)
	if code != ExitOK {
		t.Fatalf("inspect: exit %d\n%s", code, errOut)
	}
	r := parseInspect(t, out)
	if o := topicOf(t, r, "orders"); o.Length != 40 || len(o.Partitions) != 3 {
		t.Fatalf("orders: %+v", o)
	}
}

// A stage's output is named stage.NAME, whether it declares an output topic or writes to the
// one the compiler makes for a stage that is read as stage.NAME.
func TestTailStageOutput(t *testing.T) {
	srv := redistest.Shared(t)
	path, prefix := testPipeline(t, ordersPipeline+`
stage "clean" {
  kind  = "map"
  input = topic.orders
  fuse  = false
  set   = { clean = true }
}

stage "split" {
  kind    = "route"
  input   = stage.clean
  default = topic.events
  case {
    when   = msg.bad == true
    output = topic.failed
  }
}
`)
	keys := redis.Keys{Prefix: prefix}
	rdb := srv.Client(t)
	url := srv.URL()
	declared := xadd(t, rdb, keys.Stream("events", 1), "payload", `{"n":1}`)
	implicit := xadd(t, rdb, keys.Stream("clean.out", 2), "payload", `{"n":2}`)
	for arg, want := range map[string]string{"stage.enrich": declared, "stage.clean": implicit} {
		code, out, errOut := runIn(t, "", "tail", "--redis", url, path, arg)
		if l := parseTail(t, out); code != ExitOK || len(l) != 1 || l[0].ID != want {
			t.Errorf("tail %s: exit %d, %q, want entry %s\n%s", arg, code, out, want, errOut)
		}
	}

	t.Setenv(EnvRedisURL, "")
	for arg, want := range map[string]string{
		"stage.clen":  `has no stage "clen". Did you mean "stage.clean"? The stages are stage.clean, stage.enrich, stage.split.`,
		"stage.split": `the route stage split writes to several topics, "failed", "events": name one of them.`,
		"evnts": `Did you mean "events"? The topics are "clean.out", "events", "failed", "orders". ` +
			`Or name a stage's output as stage.NAME: the stages are stage.clean, stage.enrich, stage.split.`,
	} {
		code, _, errOut := runIn(t, "", "tail", path, arg)
		if code != ExitInvalid || !strings.Contains(errOut, want) {
			t.Errorf("tail %s: exit %d, want %q in\n%s", arg, code, want, errOut)
		}
	}
}
