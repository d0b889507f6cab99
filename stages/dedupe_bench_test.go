package stages

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkDedupeMessage is the dedupe's own work per message of the dedupe benchmark's shape (a
// key of a string field, event time in Unix ms, one message in ten a duplicate of an earlier one):
// naming its state keys, reading its event time as the watermarks do, then Process, on a state in
// memory.
func BenchmarkDedupeMessage(b *testing.B) {
	p := plan(b, dedupeByID)
	proc, err := CompileStateful(p.Stage("once"), Env{Node: "once"})
	if err != nil {
		b.Fatal(err)
	}
	eventTime := proc.Processor.(*dedupeStage).eventTime
	payloads := make([][]byte, 100_000)
	for i := range payloads {
		id := i
		if i%10 == 9 {
			id = i - 5 // a duplicate
		}
		payloads[i] = fmt.Appendf(nil, `{"ts":1764478823321000000,"seq":"f%09d","key":"k%04d","id":"f%09d","amount":%d,"at":%d,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`,
			i, i%1000, id, i%5000, 1764478823000+int64(i/100))
	}
	ctx := context.Background()
	st := newMemState()
	var keys []string
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%len(payloads) == 0 {
			st = newMemState() // the same keys again are not all duplicates
		}
		m := NewEntryMessage("", payloads[i%len(payloads)], nil)
		keys = proc.StatePrefetcher.StateKeys(&m, keys[:0])
		at, _ := EventTime(eventTime, &m)
		st.watermark = max(st.watermark, at.UnixMilli())
		if _, err := proc.Processor.Process(ctx, st, &m, nil); err != nil {
			b.Fatal(err)
		}
	}
}
