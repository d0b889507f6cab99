package stages

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkAggregateMessage is the aggregate's own work per message of FW-1 aggregate's shape (a
// count and a sum per key of 1000, windows of a second): naming its state keys, then Process, on a
// state in memory. Batches of 100 messages, a window's timers fired after each.
func BenchmarkAggregateMessage(b *testing.B) {
	src := `
stage "agg" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.key
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1s"
  }
  grace = "1s"
  aggregate = {
    messages = count()
    amount   = sum(msg.amount)
  }
}
` + sinkA
	p := plan(b, src)
	proc, err := CompileStateful(p.Stage("agg"), Env{Node: "agg"})
	if err != nil {
		b.Fatal(err)
	}
	st := newMemState()
	eventTime := proc.Processor.(*aggregateStage).eventTime
	payloads := make([][]byte, 100_000)
	for i := range payloads {
		payloads[i] = fmt.Appendf(nil, `{"ts":1764478823321000000,"seq":"f%09d","key":"k%04d","id":"f%09d","amount":%d,"at":%d,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`,
			i, (i*7919)%1000, i, i%5000, 1764478823000+int64(i/100))
	}
	ctx := context.Background()
	var keys []string
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		m := NewEntryMessage("", payloads[i%len(payloads)], nil)
		keys = proc.StatePrefetcher.StateKeys(&m, keys[:0])
		at, _ := EventTime(eventTime, &m) // the watermark a second behind, as the grace allows
		st.watermark = max(st.watermark, at.UnixMilli()-1000)
		if _, err := proc.Processor.Process(ctx, st, &m, nil); err != nil {
			b.Fatal(err)
		}
		if i%100 == 99 {
			for name, due := range st.timers {
				if due <= st.watermark {
					delete(st.timers, name)
					if _, err := proc.TimerHandler.OnTimer(ctx, st, name, epoch, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
	}
}
