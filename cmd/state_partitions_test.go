package cmd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A stateful stage keeps its state per input partition: flowrun run refuses a changed partition
// count while state exists (exit 2, with a message that names the stage, the topic, both counts
// and the ways on) and accepts it once the state is gone, or when there was none left, on a
// single server and on a cluster.
func TestRunRefusesNewPartitionsUnderState(t *testing.T) {
	for name, urls := range map[string][]string{
		"server":  {redistest.Shared(t).URL()},
		"cluster": redistest.SharedCluster(t, 3).URLs(),
	} {
		t.Run(name, func(t *testing.T) {
			redisURL := strings.Join(urls, ",")
			c, err := redis.Open(context.Background(), redis.Options{URLs: urls})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()

			// A dedupe remembers its keys after a job: its state stays.
			once := statefulPipeline(t, `
stage "once" {
  kind   = "dedupe"
  input  = topic.orders
  key    = msg.k
  within = "1h"
}
sink "out" {
  kind  = "stdout"
  input = stage.once
}
`)
			run := func(partitions int) (int, string) {
				t.Helper()
				code, _, errOut := runIn(t, "", "run", once(partitions), "--until-drained", "--redis", redisURL)
				return code, errOut
			}
			if code, errOut := run(2); code != ExitOK {
				t.Fatalf("the first run: exit %d\n%s", code, errOut)
			}
			code, errOut := run(3)
			if code != ExitInvalid {
				t.Fatalf("with 3 partitions under the state of 2: exit %d, want %d\n%s", code, ExitInvalid, errOut)
			}
			for _, want := range []string{"stage once keeps state for topic orders (declared at ", "with 2 partitions, and it has 3 now",
				"partitions 0, 1 of 2 hold state", "keep partitions = 2 for topic orders", "flowrun run --until-drained", "redis-cli -c DEL"} {
				if !strings.Contains(errOut, want) {
					t.Errorf("the refusal lacks %q:\n%s", want, errOut)
				}
			}
			// Deleting the state the way the refusal says lets the new count in, and records it.
			del := regexp.MustCompile(`for p in \$\(seq 0 (\d+)\); do redis-cli -c DEL "([^"]+)" "([^"]+)"; done`).FindStringSubmatch(errOut)
			if del == nil || del[1] != "1" {
				t.Fatalf("the refusal has no loop over partitions 0 to 1 that deletes the state:\n%s", errOut)
			}
			for p := range 2 {
				keys := []string{strings.ReplaceAll(del[2], "$p", fmt.Sprint(p)), strings.ReplaceAll(del[3], "$p", fmt.Sprint(p))}
				if n, err := c.Universal().Del(context.Background(), keys...).Result(); err != nil || n != 2 {
					t.Fatalf("DEL %v: %d keys, %v; want both deleted", keys, n, err)
				}
			}
			if code, errOut := run(3); code != ExitOK {
				t.Fatalf("with 3 partitions once the state is deleted: exit %d\n%s", code, errOut)
			}
			if code, errOut := run(2); code != ExitInvalid || !strings.Contains(errOut, "with 3 partitions, and it has 2 now") {
				t.Fatalf("back to 2 partitions under the state of 3: exit %d, want %d\n%s", code, ExitInvalid, errOut)
			}

			// A job closes an aggregate's windows: nothing is left, and the count may change. It groups
			// by another field than the topic's key, so it reads a repartition topic, which has the
			// partitions of orders.
			perMinute := statefulPipeline(t, `
stage "per_minute" {
  kind     = "aggregate"
  input    = topic.orders
  group_by = msg.g
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { orders = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.per_minute
}
`)
			for _, partitions := range []int{2, 3} {
				code, _, errOut := runIn(t, "", "run", perMinute(partitions), "--until-drained", "--redis", redisURL)
				if code != ExitOK {
					t.Fatalf("the aggregate's job with %d partitions: exit %d\n%s", partitions, code, errOut)
				}
				if changed := strings.Contains(errOut, "the new count is recorded"); changed != (partitions == 3) {
					t.Errorf("with %d partitions, the change is logged: %v\n%s", partitions, changed, errOut)
				}
			}
		})
	}
}

// statefulPipeline returns a function that writes a pipeline of a generate source, a topic orders
// with the given number of partitions and the given blocks, always with the same key prefix, and
// returns its path.
func statefulPipeline(t *testing.T, blocks string) func(partitions int) string {
	path, prefix := testPipeline(t, "")
	return func(partitions int) string {
		src := fmt.Sprintf(`pipeline "p" {
  key_prefix = %q
}
topic "orders" {
  partitions = %d
  key        = msg.k
}
source "gen" {
  kind     = "generate"
  count    = 6
  output   = topic.orders
  template = { k = "k${index %% 4}", g = "g${index %% 3}" }
}
%s`, prefix, partitions, blocks)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return filepath.Clean(path)
	}
}
