package cmd

import (
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

func TestProgressLine(t *testing.T) {
	start := time.Unix(1000, 0)
	var m rateMeter
	snap := func(produced int64, at time.Time) runtime.Snapshot {
		return runtime.Snapshot{Taken: at, Sources: []runtime.SourceProgress{{Name: "gen", Produced: produced, Total: 1000}},
			Partitions: []runtime.PartitionState{{Lag: 30, Pending: 10, Retries: 2}}}
	}
	progressOf(snap(0, start), &m)
	p := progressOf(snap(250, start.Add(time.Second)), &m)
	if p.done != 250 || p.total != 1000 || p.rate != 250 || p.queued != 42 || p.eta != 3*time.Second {
		t.Fatalf("progress = %+v", p)
	}
	if got := p.line(); got != "[======                  ] 250/1000  25%  250 msg/s  ETA 3s  queued 42" {
		t.Fatalf("line = %q", got)
	}
	unknown := runtime.Snapshot{Taken: start, Sources: []runtime.SourceProgress{{Name: "file", Produced: 7}}}
	if got := progressOf(unknown, &rateMeter{}).line(); !strings.HasPrefix(got, "7 messages") {
		t.Fatalf("line without a total = %q", got)
	}
	attrs := p.attrs()
	if len(attrs) != 10 || attrs[0] != "produced" || attrs[7] != int64(1000) {
		t.Fatalf("attrs = %v", attrs)
	}
	waiting := snap(300, start.Add(2*time.Second))
	waiting.RedisFailingSince = start
	waiting.Nodes = []runtime.NodeSummary{
		{Type: "sink", Name: "hook", PausedSince: start, PausedBy: "connection refused"},
		{Type: "source", Name: "gen", HeldBackBy: "in"},
		{Type: "stage", Name: "busy"},
		{Type: "stage", Name: "per_tenant", Delaying: 3, Delayed: time.Second},
	}
	if got := progressOf(waiting, &rateMeter{}).line(); !strings.HasSuffix(got,
		"  waiting: Redis failing for 2s, sink.hook paused, source.gen held back by topic.in, stage.per_tenant delayed: 3 waiting for the rate limit") {
		t.Fatalf("line while waiting = %q", got)
	}
}
