package runtime_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The nats kinds through SIGKILLs of the flowrun process (see nats_test.go for the server): the
// source, with effectively-once delivery, writes each message once though JetStream delivers again
// what the killed process had not acknowledged; the sink publishes each entry once though the
// runtime delivers again what the killed process had not acknowledged.

// natsKillCycles is how many processes each test kills, and how many messages it sends.
func natsKillCycles() (kills, n int) {
	if *soakFlag {
		return 8, 100000
	}
	return 3, 12000
}

// TestNATSSourceThroughKills publishes messages to a stream while flowrun processes read it into
// the topic with effectively-once delivery, and SIGKILLs each after random progress; a last process
// runs until everything is there: each message once, keyed by its subject.
func TestNATSSourceThroughKills(t *testing.T) {
	t.Parallel()
	kills, n := natsKillCycles()
	js := natsJS(t)
	stream := natsName(t)
	natsStream(t, js, stream, nil)
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("natskill-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "nats.hcl")
	writeFile(t, path, natsSourcePipeline(prefix, "effectively_once", stream))
	entries := func() int64 {
		var total int64
		for _, s := range (redis.Keys{Prefix: prefix}).Streams("in", 4) {
			l, err := c.Universal().XLen(context.Background(), s).Result()
			if err != nil {
				t.Fatal(err)
			}
			total += l
		}
		return total
	}
	// The publisher goes on through the kills, a slice at a time.
	var published atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for from := 0; from < n; from += 500 {
			natsPublish(t, js, stream, from, min(from+500, n))
			published.Store(int64(min(from+500, n)))
			time.Sleep(20 * time.Millisecond)
		}
	}()
	bin := flowrunBinary(t)
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "300ms"}
	var logs []string
	for cycle := 0; cycle < kills; cycle++ {
		before := entries()
		p := startBinary(t, bin, args...)
		progress := int64(300 + rand.IntN(2000))
		waitFor(t, fmt.Sprintf("cycle %d: %d entries more", cycle, progress), func() bool {
			return entries()-before >= progress || entries() >= int64(n)
		})
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	<-done
	last := startBinary(t, bin, args...)
	waitFor(t, "every message in the topic", func() bool { return entries() >= int64(n) })
	// What JetStream delivers again after the last kill's ack_wait (2s) must find its entries
	// there and be dropped: wait for the consumer to have everything acknowledged.
	waitFor(t, "JetStream to have every message acknowledged", func() bool {
		cons, err := js.Consumer(context.Background(), stream, "flowrun")
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == uint64(n)
	})
	last.kill(t)
	logs = append(logs, last.log.String())
	checkEachOnce(t, natsTopic(t, c, prefix, stream), n)
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	t.Logf("%d messages published while %d processes were SIGKILLed: each once in the topic; %d leases lost", n, kills, leaseLosses(logs...))
}

// TestNATSSinkThroughKills publishes a topic's messages to JetStream with flowrun processes that
// are SIGKILLed after random progress, the runtime delivering again what a killed process had not
// acknowledged; a last process runs until every entry is acknowledged: each message is in the
// stream once, JetStream having dropped the repeats by their Nats-Msg-Id.
func TestNATSSinkThroughKills(t *testing.T) {
	t.Parallel()
	kills, n := natsKillCycles()
	js := natsJS(t)
	stream := natsName(t)
	natsStream(t, js, stream, nil)
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("natssinkkill-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "nats.hcl")
	writeFile(t, path, natsSinkPipeline(prefix, "at_least_once", natsURL(), fmt.Sprintf(`"%s.out.${key}"`, stream)))
	plan := buildSource(t, natsSinkPipeline(prefix, "at_least_once", natsURL(), fmt.Sprintf(`"%s.out.${key}"`, stream)))
	plan.KeyPrefix = prefix // buildSource gives a plan a prefix of its own: the processes use the file's
	publishIn(t, plan, 0, n, nil)
	stored := func() uint64 {
		s, err := js.Stream(context.Background(), stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	bin := flowrunBinary(t)
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "300ms"}
	var logs []string
	for cycle := 0; cycle < kills; cycle++ {
		before := stored()
		p := startBinary(t, bin, args...)
		progress := uint64(300 + rand.IntN(2000))
		waitFor(t, fmt.Sprintf("cycle %d: %d messages more in the stream", cycle, progress), func() bool {
			return stored()-before >= progress || stored() >= uint64(n)
		})
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	last := startBinary(t, bin, args...)
	waitFor(t, "every entry acknowledged", func() bool { return acked(t, c, prefix, "in", 4, "jet") == int64(n) })
	last.kill(t)
	logs = append(logs, last.log.String())
	checkEachOnce(t, natsStored(t, js, stream), n)
	if list := sinkDeadLetters(t, c, plan, "jet"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	t.Logf("%d messages published through %d SIGKILLs: each once in the stream; %d leases lost", n, kills, leaseLosses(logs...))
}
