package runtime_test

import (
	"context"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// largePayload is a 20 MB message: a few small fields and one big string, the shape of a document
// or an image sent inline.
func largePayload() []byte {
	const size = 20 << 20
	head := `{"id":"doc-1","type":"upload","body":"`
	return []byte(head + strings.Repeat("x", size-len(head)-2) + `"}`)
}

const largePayloadStages = `
pipeline "large" {}
topic "in" {}
topic "out" {}
stage "identity" {
  kind   = "map"
  input  = topic.in
  output = topic.out
}
stage "stamp" {
  kind   = "map"
  input  = topic.in
  output = topic.out
  set    = { seen = true }
}
sink "print" {
  kind  = "stdout"
  input = topic.out
}
`

// hopAllocations measures the bytes one hop allocates for a 20 MB entry: XREAD of the entry and
// its decoding (DecodeEntry), the stage, the output's encoding (EncodeEntry) and its XADD. It
// returns them as a multiple of the payload's size.
func hopAllocations(t *testing.T, stage string) float64 {
	t.Helper()
	c := server.open(t)
	raw := goredis.NewClient(&goredis.Options{Addr: redistest.Shared(t).Addr()})
	defer raw.Close()
	plan := buildSource(t, largePayloadStages)
	proc, err := stages.Compile(plan.Stage(stage), stages.Env{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	in, out := keys.Stream("in", 0), keys.Stream("out", 0)
	payload := largePayload()
	if err := c.Append(ctx, []redis.Output{{Stream: in, Entry: redis.Entry{Key: "doc-1", Payload: payload}}}); err != nil {
		t.Fatal(err)
	}
	defer raw.Del(ctx, in, out)
	var failure error
	res := testing.Benchmark(func(b *testing.B) {
		for i := 0; i < b.N && failure == nil; i++ {
			recs, err := c.Read(ctx, in, "0", 1, 0)
			if err != nil || len(recs) != 1 || recs[0].Malformed != nil {
				failure = err
				if err == nil {
					t.Errorf("read %d records (%+v), want the one entry", len(recs), recs)
				}
				return
			}
			e := recs[0].Entry
			m := stages.NewMessage(e.Key, e.Payload, e.Headers)
			outs, err := proc.Process(ctx, &m, nil)
			if err != nil || len(outs) != 1 {
				failure = err
				return
			}
			p, err := outs[0].Message.Payload()
			if err != nil {
				failure = err
				return
			}
			err = c.Append(ctx, []redis.Output{{Stream: out, Entry: redis.Entry{Key: e.Key, Payload: p}}})
			if err != nil {
				failure = err
				return
			}
			b.StopTimer() // the output stream holds one entry at a time
			raw.Del(ctx, out)
			b.StartTimer()
		}
	})
	if failure != nil {
		t.Fatal(failure)
	}
	ratio := float64(res.AllocedBytesPerOp()) / float64(len(payload))
	t.Logf("%s: %d ops, %d bytes allocated per op, %.2f times the payload of %d bytes",
		stage, res.N, res.AllocedBytesPerOp(), ratio, len(payload))
	return ratio
}

// TestLargePayloadMemory holds a 20 MB message's hop to about three times its size in memory, both
// for a stage that passes the payload on unchanged and for one that decodes and re-encodes it.
func TestLargePayloadMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 20 MB entries through Redis")
	}
	for _, stage := range []string{"identity", "stamp"} {
		t.Run(stage, func(t *testing.T) {
			if ratio := hopAllocations(t, stage); ratio > 3.1 {
				t.Errorf("a hop of %s allocates %.2f times the payload's size, want at most about 3", stage, ratio)
			}
		})
	}
}
