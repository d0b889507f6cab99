package runtime_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestWhereOnAnEntryThatIsNoObject: reading a stream takes any valid JSON as an entry's payload,
// and a filter's where (which decodes only the fields it reads) dead-letters one that is no object,
// as it did when it decoded it whole, and goes on with the next, rather than crash the process.
func TestWhereOnAnEntryThatIsNoObject(t *testing.T) {
	ctx := context.Background()
	c := server.open(t)
	plan := buildSource(t, `
pipeline "no_object" {}
topic "in" {}
topic "out" {}
stage "keep" {
  kind   = "filter"
  input  = topic.in
  output = topic.out
  where  = msg.a == 1
}
`)
	in := redis.Keys{Prefix: plan.KeyPrefix}.Stream("in", 0)
	for _, p := range []string{`[1,2]`, `"abc"`, `{"a":1}`} {
		if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: in, Values: []any{redis.FieldPayload, p}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	j := runJob(t, c, plan, runtime.Options{})
	if n := j.node(t, "keep"); n.DeadLettered != 2 || n.Out != 1 {
		t.Errorf("keep: %+v, want the list and the string dead-lettered and the object passed on", n)
	}
}
