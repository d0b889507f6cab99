package runtime_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The mqtt kinds' round trip (see mqtt_test.go for the brokers): messages published to a private
// Mosquitto come in through the source, go through two stages and out through the sink to the
// same broker, while the flowrun processes are SIGKILLed twice and the broker is stopped and
// started again once.

// mqttRoundTripSize is how many messages the round trip sends: 100,000 with -soak.
func mqttRoundTripSize() int {
	if *soakFlag {
		return 100000
	}
	return 5000
}

// mqttRoundTripPipeline reads <base>/in/# into topic "in", through a map and a filter, and
// publishes on <base>/out/k<i%10>.
func mqttRoundTripPipeline(prefix, delivery, url, base, clientID string) string {
	return fmt.Sprintf(`
pipeline "mqttroundtrip" {
  key_prefix = %[1]q
  delivery   = %[2]q
}
topic "in" {
  partitions = 4
}
source "mq_in" {
  kind      = "mqtt"
  url       = %[3]q
  topics    = ["%[4]s/in/#"]
  client_id = %[5]q
  output    = topic.in
}
stage "mark" {
  kind  = "map"
  input = topic.in
  set   = { k = "k${msg.i %% 10}", via = "flowrun" }
}
stage "keep" {
  kind  = "filter"
  input = stage.mark
  where = msg.via == "flowrun"
}
sink "mq_out" {
  kind  = "mqtt"
  input = stage.keep
  url   = %[3]q
  topic = "%[4]s/out/${trimprefix(key, "%[4]s/in/")}"
}
`, prefix, delivery, url, base, clientID)
}

// TestMQTTRoundTripThroughKills sends messages through the source, two stages and the sink, back
// to the broker, while the flowrun process is SIGKILLed twice and the broker is restarted once
// (stopped and started: its persistence keeps the sessions and their queued messages):
//
//   - ids: the publisher gives each message a message_id and delivery is effectively-once: each
//     message is in the source's topic once, though the broker delivers again what a killed
//     process had not acknowledged; out of the sink each arrives at least once, and once by its
//     message_id (the sink publishes again what it had published without its entry being
//     acknowledged, with the same message_id).
//   - no_ids: no message_id, at-least-once: each message is in the topic and arrives at least once.
//
// Each MQTT topic's messages arrive in order (of their first arrival), with their user
// properties and traceparent.
func TestMQTTRoundTripThroughKills(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		ids      bool
		delivery string
	}{{"ids", true, "effectively_once"}, {"no_ids", false, "at_least_once"}} {
		t.Run(tc.name, func(t *testing.T) {
			n := mqttRoundTripSize()
			broker := startMQTTBroker(t, "")
			base, clientID := mqttName(t), mqttName(t)
			srv := redistest.Shared(t)
			c := openURLs(t, srv.URL())
			prefix := fmt.Sprintf("mqttroundtrip-%d", prefixes.Add(1))
			path := filepath.Join(t.TempDir(), "mqtt.hcl")
			writeFile(t, path, mqttRoundTripPipeline(prefix, tc.delivery, broker.url(), base, clientID))
			plan := buildSource(t, mqttRoundTripPipeline(prefix, tc.delivery, broker.url(), base, clientID))
			plan.KeyPrefix = prefix // buildSource gives a plan a prefix of its own: the processes use the file's
			deadLetters := func() string {
				var said []string
				for _, node := range []string{"mark", "keep", "mq_out"} {
					if list := sinkDeadLetters(t, c, plan, node); len(list) > 0 {
						said = append(said, fmt.Sprintf("%d dead letters of %s, such as %q", len(list), node, list[0].Envelope.Error))
					}
				}
				return strings.Join(said, "; ")
			}
			// The source's session exists before the first publication (its first run would make it).
			newMQTTClient(t, broker.addr, clientID, func(*paho.Publish) {}, base+"/in/#").close()
			read := newMQTTReader(t, broker.addr, base+"/out/#")
			pub := newMQTTClient(t, broker.addr, mqttName(t), nil)
			arrived := func() int {
				seen, _ := read.check(t, base)
				return len(seen)
			}
			var published atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				for from := 0; from < n; from += 500 {
					mqttPublish(t, pub, base+"/in", from, min(from+500, n), tc.ids)
					published.Store(int64(min(from+500, n)))
					time.Sleep(10 * time.Millisecond) // a steady stream, through the kills
				}
			}()
			bin := flowrunBinary(t)
			// A lease of 2s: on a loaded machine a shorter one is lost often, and an entry taken over
			// more than 5 times is dead-lettered as poison.
			args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "2s"}
			var logs []string
			// waitOut waits until enough messages are out, failing with the process's log when
			// none more came out in a minute.
			waitOut := func(what string, enough int, p *process) {
				t.Helper()
				for at, since := arrived(), time.Now(); at < enough; {
					if time.Since(since) > time.Minute {
						in, inSeen := 0, mqttTopic(t, c, prefix, base+"/in")
						for _, k := range inSeen {
							in += k
						}
						t.Logf("topic in holds %d distinct messages", len(inSeen))
						var outLen, pending int64
						for _, st := range (redis.Keys{Prefix: prefix}).Streams("keep.out", 4) {
							l, _ := c.Universal().XLen(context.Background(), st).Result()
							outLen += l
							if pi, err := c.Universal().XPending(context.Background(), st, "mq_out").Result(); err == nil {
								pending += pi.Count
							}
						}
						t.Logf("keep.out holds %d entries, %d pending for mq_out; dead letters: %s", outLen, pending, deadLetters())
						_ = p.cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, in its log
						_ = waitProcess(t, p)
						t.Fatalf("%s: %d of %d messages out, none more in a minute; %d entries in topic in, %d acknowledged by mark, %d by keep, %d by mq_out; the process's log:\n%s",
							what, at, enough, in, acked(t, c, prefix, "in", 4, "mark"), acked(t, c, prefix, "mark.out", 4, "keep"),
							acked(t, c, prefix, "keep.out", 4, "mq_out"), p.log.String())
					}
					time.Sleep(100 * time.Millisecond) // polling the reader
					if a := arrived(); a > at {
						at, since = a, time.Now()
					}
				}
			}
			step := func(what string, p *process) {
				t.Helper()
				waitOut(what, min(n, arrived()+n/10+rand.IntN(n/10)), p)
			}
			p := startBinary(t, bin, args...)
			step("the first process", p)
			p.kill(t)
			logs = append(logs, p.log.String())
			p = startBinary(t, bin, args...)
			step("the second process", p)
			broker.stop()
			broker.start()
			step("the second process, after the broker's restart", p)
			p.kill(t)
			logs = append(logs, p.log.String())
			<-done
			last := startBinary(t, bin, args...)
			waitOut("the last process", n, last)
			last.kill(t)
			logs = append(logs, last.log.String())
			inTopic := mqttTopic(t, c, prefix, base+"/in")
			seen, ids := read.check(t, base)
			twiceOut := checkEachAtLeastOnce(t, seen, n)
			var twiceIn int
			if tc.ids {
				checkEachOnce(t, inTopic, n)
				if ids != n {
					t.Errorf("%d distinct message_ids out, want %d", ids, n)
				}
			} else {
				twiceIn = checkEachAtLeastOnce(t, inTopic, n)
			}
			if said := deadLetters(); said != "" {
				t.Errorf("dead letters: %s", said)
			}
			if t.Failed() {
				for i, l := range logs {
					t.Logf("process %d:\n%s", i, l)
				}
			}
			t.Logf("%d messages (%s, %s) through 2 SIGKILLs and a broker restart: %d in the topic more than once, %d out more than once, %d distinct message_ids out; %d leases lost",
				n, tc.name, tc.delivery, twiceIn, twiceOut, ids, leaseLosses(logs...))
		})
	}
}
