package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// oncePipeline is an effectively-once stage over two partitions and a redis_stream sink that
// copies its outputs to the stream var.ext.
const oncePipeline = `
pipeline "once" {
  delivery = "effectively_once"
}
variable "ext" {}
topic "in" {
  partitions = 2
  key        = msg.i
}
topic "out" {
  partitions = 2
}
stage "work" {
  kind   = "map"
  input  = topic.in
  output = topic.out
  set    = { seen = true }
}
sink "ext" {
  kind   = "redis_stream"
  input  = topic.out
  stream = var.ext
}
`

// keysLike returns the keys that match pattern, on every master of a cluster.
func keysLike(t *testing.T, c *redis.Client, pattern string) []string {
	t.Helper()
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, r *goredis.Client) error {
		found, err := r.Keys(ctx, pattern).Result()
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, found...)
		return err
	}
	var err error
	switch u := c.Universal().(type) {
	case *goredis.ClusterClient:
		err = u.ForEachMaster(context.Background(), scan)
	case *goredis.Client:
		err = scan(context.Background(), u)
	default:
		t.Fatalf("a client of type %T", u)
	}
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestEffectivelyOnceKeepsNoMarkers: on a single server, an effectively-once stage and a
// redis_stream sink write every message once and keep no marker per message, only a commit record
// per partition; on a cluster, where outputs are written before the acks, each output has its
// marker.
func TestEffectivelyOnceKeepsNoMarkers(t *testing.T) {
	const n = 300
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			ext := fmt.Sprintf("once-ext-%d", prefixes.Add(1))
			plan := buildSource(t, oncePipeline, "ext="+ext)
			publishNumbered(t, c, plan, 0, n)
			runJob(t, c, plan, runtime.Options{})
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			out := map[int]int{}
			for p := range 2 {
				for i, k := range arrivals(t, c, keys.Stream("out", p)) {
					out[i] += k
				}
			}
			if dups := tally(t, out, n); dups != 0 {
				t.Errorf("%d duplicates in topic out", dups)
			}
			if dups := tally(t, arrivals(t, c, ext), n); dups != 0 {
				t.Errorf("%d duplicates in %s", dups, ext)
			}
			markers := len(keysLike(t, c, plan.KeyPrefix+":*:dedup:*"))
			records := keysLike(t, c, plan.KeyPrefix+":*:commit")
			t.Logf("%s: %d markers, commit records %v", b.name, markers, records)
			if c.IsCluster() {
				if markers != 2*n {
					t.Errorf("%d markers on a cluster, want one per output of the stage and of the sink (%d)", markers, 2*n)
				}
				return
			}
			if markers != 0 {
				t.Errorf("%d markers on a single server, want none", markers)
			}
			want := map[string]bool{
				redis.LeaseCommit(keys.Lease("in", 0, "work")): true, redis.LeaseCommit(keys.Lease("in", 1, "work")): true,
				redis.LeaseCommit(keys.Lease("out", 0, "ext")): true, redis.LeaseCommit(keys.Lease("out", 1, "ext")): true,
			}
			for _, r := range records {
				if !want[r] {
					t.Errorf("a commit record %s, want only those of the partitions' leases", r)
				}
			}
			if len(records) != len(want) || strings.Contains(fmt.Sprint(records), "dedup") {
				t.Errorf("commit records %v, want one per partition of each node: %v", records, want)
			}
		})
	}
}
