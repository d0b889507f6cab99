package state

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// storeOfNothing is a Store whose partition holds no state, for measuring a batch in memory.
type storeOfNothing struct{ Store }

func (storeOfNothing) ReadStates(_ context.Context, _ string, keys []string) ([][]byte, error) {
	return make([][]byte, len(keys)), nil
}

func (storeOfNothing) DueTimers(context.Context, string, int64, int64) ([]redis.DueTimer, error) {
	return nil, nil
}

// BenchmarkBatchDedupeMessage is what the state of a batch costs per message of a dedupe that
// remembers a new key (the state calls its Process makes: the key and the count of keys read, both
// written, the key added to a timer group), in batches of 1000 read ahead, as the runtime runs it.
func BenchmarkBatchDedupeMessage(b *testing.B) {
	const batch = 1000
	ids := make([]string, 100_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("f%09d", i)
	}
	ctx := context.Background()
	at := time.UnixMilli(1764478823000)
	var keys []string
	b.ReportAllocs()
	b.ResetTimer()
	for start := 0; start < b.N; start += batch {
		n := min(batch, b.N-start)
		st := NewBatch(storeOfNothing{}, Keys{Hash: "h", Timers: "t"}, 0, nil, nil)
		keys = keys[:0]
		for i := range n {
			keys = append(keys, ids[(start+i)%len(ids)], stages.KeyCountKey)
		}
		st.Prefetch(ctx, keys)
		for i := range n {
			key := ids[(start+i)%len(ids)]
			a := st.Attempt(at.UnixMilli())
			if _, _, err := a.Get(ctx, key); err != nil {
				b.Fatal(err)
			}
			count, _, _ := a.Get(ctx, stages.KeyCountKey)
			c, _ := strconv.ParseInt(string(count), 10, 64)
			_ = a.Put(ctx, stages.KeyCountKey, strconv.AppendInt(nil, c+1, 10))
			_ = a.Put(ctx, key, strconv.AppendInt(nil, at.UnixMilli(), 10))
			_ = a.AddTimerMember(ctx, "key:", at.Add(time.Hour), key)
			a.Join()
		}
		if st.Writes() == nil {
			b.Fatal("no writes")
		}
	}
}
