package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// parseTail decodes tail's output.
func parseTail(t *testing.T, out string) []tailLine {
	t.Helper()
	var lines []tailLine
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		var tl tailLine
		if err := json.Unmarshal([]byte(l), &tl); err != nil {
			t.Fatalf("tail printed %q: %v", l, err)
		}
		lines = append(lines, tl)
	}
	return lines
}

// payloadOf decodes a tail line's payload.
func payloadOf(t *testing.T, l tailLine) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(l.Payload, &v); err != nil {
		t.Fatalf("payload %s: %v", l.Payload, err)
	}
	return v
}

// checkPartitionOrder checks that every line is in the partition its key picks (when keyed) and
// that within a partition the seq fields grow.
func checkPartitionOrder(t *testing.T, lines []tailLine, partitions int) {
	t.Helper()
	lastSeq := map[int]float64{}
	for _, l := range lines {
		if l.Key != "" {
			if want := redis.Partition(l.Key, partitions); l.Partition != want {
				t.Errorf("entry %s with key %q is in partition %d, want %d", l.ID, l.Key, l.Partition, want)
			}
		}
		seq := payloadOf(t, l)["seq"].(float64)
		if last, ok := lastSeq[l.Partition]; ok && seq <= last {
			t.Errorf("partition %d: seq %v after %v", l.Partition, seq, last)
		}
		lastSeq[l.Partition] = seq
	}
}

func orderLines(n, customers int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"customer_id":"c-%d","seq":%d,"amount":%d.5}`+"\n", i%customers, i, i)
	}
	return b.String()
}

func TestProduceThenTail(t *testing.T) {
	url := redistest.Shared(t).URL()
	path, _ := testPipeline(t, ordersPipeline)
	code, out, errOut := runIn(t, orderLines(30, 7), "produce", "--redis", url, path, "orders")
	if code != ExitOK || out != "" || !strings.Contains(errOut, "published 30 messages to topic orders") {
		t.Fatalf("produce: exit %d\nstdout %q\nstderr %s", code, out, errOut)
	}
	code, out, errOut = runIn(t, "", "tail", "--redis", url, path, "orders")
	if code != ExitOK {
		t.Fatalf("tail: exit %d\n%s", code, errOut)
	}
	lines := parseTail(t, out)
	if len(lines) != 30 {
		t.Fatalf("tail printed %d lines, want 30:\n%s", len(lines), out)
	}
	seen := map[float64]bool{}
	for i, l := range lines {
		v := payloadOf(t, l)
		// The topic's key expression computed the key.
		if l.Key != v["customer_id"] || l.Headers != nil || l.Error != "" {
			t.Errorf("line %d = %+v, payload %v", i, l, v)
		}
		seen[v["seq"].(float64)] = true
		// Without --follow, the partitions are merged in ID order (partitions are separate
		// streams, so two of them can have entries with the same ID).
		if i > 0 {
			if c, _ := redis.CompareIDs(lines[i-1].ID, l.ID); c > 0 {
				t.Errorf("line %d: ID %s after %s", i, l.ID, lines[i-1].ID)
			}
		}
	}
	if len(seen) != 30 {
		t.Errorf("%d distinct messages of 30", len(seen))
	}
	checkPartitionOrder(t, lines, 3)
	parts := map[int]bool{}
	for _, l := range lines {
		parts[l.Partition] = true
	}
	if len(parts) != 3 {
		t.Errorf("messages went to partitions %v, want all 3", parts)
	}
}

func TestProduceKeyFlag(t *testing.T) {
	url := redistest.Shared(t).URL()
	path, _ := testPipeline(t, ordersPipeline)
	var in strings.Builder
	for i := range 12 {
		fmt.Fprintf(&in, `{"user":{"id":"u%d"},"seq":%d}`+"\n", i%4, i)
	}
	code, _, errOut := runIn(t, in.String(), "produce", "--redis", url, "--key", `"user-${msg.user.id}"`, path, "events")
	if code != ExitOK || !strings.Contains(errOut, "published 12 messages to topic events") {
		t.Fatalf("produce: exit %d\n%s", code, errOut)
	}
	code, out, errOut := runIn(t, "", "tail", "--redis", url, path, "events")
	if code != ExitOK {
		t.Fatalf("tail: exit %d\n%s", code, errOut)
	}
	lines := parseTail(t, out)
	if len(lines) != 12 {
		t.Fatalf("tail printed %d lines, want 12", len(lines))
	}
	for _, l := range lines {
		v := payloadOf(t, l)
		if want := "user-" + v["user"].(map[string]any)["id"].(string); l.Key != want {
			t.Errorf("key %q, want %q", l.Key, want)
		}
	}
	checkPartitionOrder(t, lines, 2)

	// On a topic with a key expression of its own, --key is not used, and produce says so.
	code, _, errOut = runIn(t, `{"customer_id":"c-1","seq":1}`+"\n", "produce", "--redis", url, "--key", "msg.seq", path, "orders")
	if code != ExitOK || !strings.Contains(errOut, "--key is not used") {
		t.Fatalf("produce --key on a keyed topic: exit %d\n%s", code, errOut)
	}
	_, out, _ = runIn(t, "", "tail", "--redis", url, path, "orders")
	if lines := parseTail(t, out); len(lines) != 1 || lines[0].Key != "c-1" {
		t.Fatalf("tail orders: %s", out)
	}
}

func TestProduceWithoutKeySpreadsOverPartitions(t *testing.T) {
	url := redistest.Shared(t).URL()
	path, _ := testPipeline(t, ordersPipeline)
	var in strings.Builder
	for i := range 10 {
		fmt.Fprintf(&in, `{"seq":%d}`+"\n", i)
	}
	if code, _, errOut := runIn(t, in.String(), "produce", "--redis", url, path, "events"); code != ExitOK {
		t.Fatalf("produce: exit %d\n%s", code, errOut)
	}
	_, out, _ := runIn(t, "", "tail", "--redis", url, path, "events")
	lines := parseTail(t, out)
	counts := map[int]int{}
	for _, l := range lines {
		if l.Key != "" {
			t.Errorf("unkeyed message has key %q", l.Key)
		}
		counts[l.Partition]++
	}
	if len(lines) != 10 || counts[0] != 5 || counts[1] != 5 {
		t.Fatalf("%d lines, per partition %v; want 5 and 5", len(lines), counts)
	}
	checkPartitionOrder(t, lines, 2)
}

func TestProduceReportsBadLinesAndPublishesTheRest(t *testing.T) {
	url := redistest.Shared(t).URL()
	path, _ := testPipeline(t, ordersPipeline)
	in := strings.Join([]string{
		`{"customer_id":"a","seq":1}`,
		`not json`,
		`[1, 2]`,
		`{"customer_id":"b","seq":2}`,
		`{"seq":3}`, // the topic's key expression fails: no customer_id
		``,          // blank lines are ignored
		`{"customer_id":"c","seq":4} {"x":1}`,
		"  {\"customer_id\":\"d\",\"seq\":5}\r", // surrounding white space and CRLF are fine
	}, "\n") // and the last line has no newline
	code, _, errOut := runIn(t, in, "produce", "--redis", url, path, "orders")
	if code != ExitError {
		t.Fatalf("exit %d, want %d\n%s", code, ExitError, errOut)
	}
	for _, want := range []string{
		"stdin:2: payload is not valid JSON",
		"stdin:3: payload is a JSON array, not an object",
		"stdin:5: ",
		"stdin:7: payload is not valid JSON: data after the value",
		"published 3 messages to topic orders",
		"Error: 4 lines not published",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	for _, notWant := range []string{"stdin:1:", "stdin:4:", "stdin:6:", "stdin:8:"} {
		if strings.Contains(errOut, notWant) {
			t.Errorf("stderr reports a good line (%s):\n%s", notWant, errOut)
		}
	}
	if !strings.Contains(errOut, "customer_id") {
		t.Errorf("the key expression's failure does not say what is missing:\n%s", errOut)
	}
	_, out, _ := runIn(t, "", "tail", "--redis", url, path, "orders")
	lines := parseTail(t, out)
	keys := map[string]bool{}
	for _, l := range lines {
		keys[l.Key] = true
	}
	if len(lines) != 3 || !keys["a"] || !keys["b"] || !keys["d"] {
		t.Fatalf("published %s", out)
	}
}

func TestProduceKeyFlagFailure(t *testing.T) {
	url := redistest.Shared(t).URL()
	path, _ := testPipeline(t, ordersPipeline)
	in := `{"user":"u1","seq":1}` + "\n" + `{"seq":2}` + "\n" + `{"user":"u3","seq":3}` + "\n"
	code, _, errOut := runIn(t, in, "produce", "--redis", url, "--key", "msg.user", path, "events")
	if code != ExitError || !strings.Contains(errOut, "stdin:2: --key: ") || !strings.Contains(errOut, "published 2 messages") {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
}

func TestProduceUnknownTopic(t *testing.T) {
	t.Setenv(EnvRedisURL, "") // the topic is checked before Redis is needed
	path, _ := testPipeline(t, ordersPipeline)
	code, _, errOut := runIn(t, "", "produce", path, "ordrs")
	if code != ExitInvalid {
		t.Fatalf("exit %d, want %d\n%s", code, ExitInvalid, errOut)
	}
	for _, want := range []string{`has no topic "ordrs"`, `Did you mean "orders"?`, `The topics are "events", "failed", "orders".`} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	code, _, errOut = runIn(t, "", "tail", path, "nothing_like_it")
	if code != ExitInvalid || strings.Contains(errOut, "Did you mean") || !strings.Contains(errOut, `"events"`) {
		t.Fatalf("tail of an unknown topic: exit %d\n%s", code, errOut)
	}
}

func TestProduceInvalidPipelineOrKey(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	bad, _ := testPipeline(t, "topic \"t\" {\n  partitions = 0\n}\n")
	if code, _, errOut := runIn(t, "", "produce", bad, "t"); code != ExitInvalid || !strings.Contains(errOut, "partitions must be at least 1") {
		t.Fatalf("invalid pipeline: exit %d\n%s", code, errOut)
	}
	path, _ := testPipeline(t, ordersPipeline)
	for _, key := range []string{"msg.", "mgs.user", "nosuchfunc(msg.user)"} {
		code, _, errOut := runIn(t, "", "produce", "--key", key, path, "events")
		if code != ExitInvalid || !strings.Contains(errOut, "invalid --key expression") || !strings.Contains(errOut, "--key line 1") {
			t.Errorf("--key %s: exit %d\n%s", key, code, errOut)
		}
	}
}

func TestProduceNeedsAConfiguredRedis(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	path, _ := testPipeline(t, ordersPipeline)
	for _, args := range [][]string{{"produce", path, "orders"}, {"tail", path, "orders"}, {"inspect", path}} {
		code, _, errOut := runIn(t, `{"customer_id":"a"}`, args...)
		if code != ExitError || !strings.Contains(errOut, "no Redis configured") || !strings.Contains(errOut, "--redis") ||
			!strings.Contains(errOut, EnvRedisURL) || strings.Contains(errOut, "embedded") {
			t.Errorf("%s: exit %d\n%s", args[0], code, errOut)
		}
	}
}

// TestProduceWaitsForAFullTopic: produce into a topic at its max_lag, with nothing reading it, waits
// and says why, instead of filling Redis.
func TestProduceWaitsForAFullTopic(t *testing.T) {
	path, prefix := testPipeline(t, `
topic "orders" { max_lag = 5 }
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
`)
	url := redistest.Shared(t).URL()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errOut := newLineWriter()
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"produce", path, "orders", "--redis", url},
			IO{In: strings.NewReader(orderLines(50, 3)), Out: io.Discard, Err: errOut})
	}()
	for line := ""; !strings.Contains(line, "max_lag (5)"); {
		line = errOut.next(t)
	}
	c, err := redis.Open(ctx, redis.Options{URLs: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := c.StreamLen(ctx, redis.Keys{Prefix: prefix}.Stream("orders", 0)); err != nil || n >= 50 {
		t.Errorf("the topic holds %d of the 50 messages (%v): produce did not wait", n, err)
	}
	cancel()
	<-done
}

// TestProduceRefusesALinkOfAFusedChain: what goes into the implicit topic between two fused stages
// would sit there unread, so produce says where to publish instead.
func TestProduceRefusesALinkOfAFusedChain(t *testing.T) {
	t.Setenv(EnvRedisURL, "") // the topic is checked before Redis is needed
	code, _, errOut := runIn(t, `{"id": 1}`+"\n", "produce", "../examples/pipelines/etl", "completed.out")
	if code != ExitInvalid {
		t.Fatalf("exit %d, want %d\n%s", code, ExitInvalid, errOut)
	}
	for _, want := range []string{"link inside the fused chain completed+normalise", "topic raw", "fuse = false on stage normalise"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}
