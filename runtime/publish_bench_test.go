package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// BenchmarkPublish publishes 200-byte messages from parallel goroutines: flowbench's publish
// scenario in process, for profiles (go test -run '^$' -bench Publish -cpuprofile ...), on a topic
// of one partition (as flowbench's) and on one of eight, and on one partition of a topic with a
// schema, which each message is decoded and checked against.
func BenchmarkPublish(b *testing.B) {
	for _, partitions := range []int{1, 8} {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) { benchmarkPublish(b, partitions, "") })
	}
	schema := `jsonencode({ type = "object", required = ["p"], properties = { p = { type = "string", maxLength = 200 } } })`
	b.Run("partitions=1/schema", func(b *testing.B) { benchmarkPublish(b, 1, schema) })
}

func benchmarkPublish(b *testing.B, partitions int, schema string) {
	ctx := context.Background()
	c, err := redis.Open(ctx, redis.Options{URLs: []string{redistest.Shared(b).URL()}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(fmt.Sprintf(`
pipeline "publish-bench" {}
topic "in" {
  partitions = %d
  %s
}
sink "out" {
  kind  = "stdout"
  input = topic.in
}
`, partitions, map[bool]string{true: "schema = " + schema}[schema != ""]))})
	plan, more := flow.Compile(cfg, flow.Options{})
	if diags = append(diags, more...); diags.HasErrors() {
		b.Fatal(diags)
	}
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"p":"` + strings.Repeat("x", 190) + `"}`)
	b.ReportAllocs()
	b.SetParallelism(2) // 4 goroutines on 2 cores, as flowbench publishes
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := pub.Publish(ctx, "in", stages.NewMessage("", payload, nil)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if err := pub.Close(ctx); err != nil {
		b.Fatal(err)
	}
}
