package redis

import (
	"fmt"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

// Raw go-redis baselines for BenchmarkProducer and BenchmarkCommit, run in the same process
// against the same server: compare ratios, not absolute numbers.

func BenchmarkRawPipelinedXAdd(b *testing.B) {
	rdb := redistest.Shared(b).Client(b)
	ctx := ctxB(b)
	stream := "bench:{rawxadd:0}"
	defer rdb.Del(ctx, stream)
	payload := []byte(`{"customer_id":"c-42","amount":99.5,"country":"de"}`)
	pipe := rdb.Pipeline()
	n := 0
	for b.Loop() {
		pipe.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"payload", payload, "key", "c-42"}})
		if n++; n == DefaultBatchSize {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			n = 0
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && n > 0 {
		b.Fatal(err)
	}
}

func BenchmarkRawCommit(b *testing.B) {
	rdb := redistest.Shared(b).Client(b)
	ctx := ctxB(b)
	in, out := "bench:{rawcommit:0}", "bench:{rawcommitout:0}"
	defer rdb.Del(ctx, in, out)
	rdb.XGroupCreateMkStream(ctx, in, "g", "0")
	payload := []byte(`{"customer_id":"c-42","amount":99.5}`)
	const batch = 100
	for b.Loop() {
		b.StopTimer()
		pipe := rdb.Pipeline()
		for range batch {
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: in, Values: []any{"payload", payload}})
		}
		_, _ = pipe.Exec(ctx)
		res, err := rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{in, ">"}, Count: 1000, Block: -1}).Result()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		pipe = rdb.Pipeline()
		ids := make([]string, 0, batch)
		for _, m := range res[0].Messages {
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: out, Values: m.Values})
			ids = append(ids, m.ID)
		}
		pipe.XAck(ctx, in, "g", ids...)
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSourceCommit is a file source's commit: a batch of outputs over four partitions and the
// source's checkpoint, in one transaction. Its allocations per op are what a source's Go CPU
// follows most.
func BenchmarkSourceCommit(b *testing.B) {
	ctx := ctxB(b)
	c, err := Open(ctx, Options{URLs: []string{redistest.Shared(b).URL()}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	k := Keys{Prefix: fmt.Sprintf("bench%d:sourcecommit", runs.Add(1))}
	payload := []byte(`{"auction":1002,"bidder":1000,"channel":"Apple","dateTime":1767225600004,"price":1148,"url":"https://example.com/item/262950"}`)
	outs := make([]Output, 1000)
	for i := range outs {
		outs[i] = Output{Stream: k.Stream("bids", i%4), Entry: Entry{Payload: payload, Key: "1002"}}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Commit(ctx, CommitArgs{Outputs: outs, Checkpoint: &Checkpoint{Key: k.SourcePosition("bids"), Value: "line"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for p := range 4 {
		c.rdb.Del(ctx, k.Stream("bids", p))
	}
}
