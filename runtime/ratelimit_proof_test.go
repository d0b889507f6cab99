package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestRateLimitHoldsAcrossProcesses is the rate limit's proof of pace (issue 23), a measurement of
// time and so only with -soak (make soak): three flowrun processes share a rate_limit stage of
// 200 messages a second per tenant, on a redis-server. For 30 s the test sends the tenant "hot" 300
// messages a second and "cold" 50. The topic (6 partitions) is keyed by a lane: hot's messages
// take five lanes, in five partitions, which the three processes share, so they take turns from
// hot's one limit in Redis at once; cold's take the sixth partition. The time a message is
// delivered is its entry's ID in the sink's stream (Redis's clock when the batch that passed it
// committed). Hot is delivered at 200 a second, within 5 %, in every 5 s window after the first
// while its backlog lasts; cold, under its limit and in a partition without hot's backlog, as soon
// as it is sent; and nothing is lost.
//
// Cold shares no partition with hot on purpose: a partition's entries are read in order, so a key
// sent faster than its limit holds back every key behind its backlog in its partitions, for as long
// as the backlog lasts (docs/design/rate-limits.md).
func TestRateLimitHoldsAcrossProcesses(t *testing.T) {
	if !*soakFlag {
		t.Skip("a measurement of time, 50 s long: make soak (-soak)")
	}
	const (
		rate, hotRate, coldRate = 200, 300, 50
		load, window            = 30 * time.Second, 5 * time.Second
		tick                    = 20 * time.Millisecond
	)
	srv := redistest.Start(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("rateproof-%d", prefixes.Add(1))
	out := prefix + ":out"
	path := filepath.Join(t.TempDir(), "rate.hcl")
	writeFile(t, path, fmt.Sprintf(`
pipeline "rate" {
  key_prefix = %q
}
topic "calls" {
  partitions = 6
  key        = msg.lane
}
stage "limit" {
  kind  = "rate_limit"
  input = topic.calls
  key   = msg.tenant
  rate  = %d
  per   = "1s"
  burst = 20
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.limit
  stream = %q
}
`, prefix, rate, out))
	plan, _, diags := flow.Build(path, flow.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	bin := flowrunBinary(t)
	args := []string{"run", path, "--redis", srv.URL(), "--log-level", "debug"} // debug: the partitions each takes
	var procs []*process
	for range 3 {
		procs = append(procs, startBinary(t, bin, args...))
	}
	for _, p := range procs {
		waitFor(t, "the processes to start", func() bool { return strings.Contains(p.log.String(), "pipeline starting") })
	}

	// Five lanes of hot's in five partitions, and cold's in the sixth.
	lanes := map[int]string{}
	for i := 0; len(lanes) < 6; i++ {
		lane := "lane-" + strconv.Itoa(i)
		if p := redis.Partition(lane, 6); lanes[p] == "" {
			lanes[p] = lane
		}
	}
	laneOf := func(tenant string, i int) string {
		if tenant == "cold" {
			return lanes[5]
		}
		return lanes[i%5]
	}

	// The load: every tick, the messages due by then, each with the time it was sent.
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]int{}
	begin := time.Now()
	ticker := time.NewTicker(tick)
	for now := begin; now.Sub(begin) < load; now = <-ticker.C {
		elapsed := now.Sub(begin).Seconds()
		for tenant, r := range map[string]int{"hot": hotRate, "cold": coldRate} {
			for ; sent[tenant] < int(elapsed*float64(r)); sent[tenant]++ {
				payload := fmt.Sprintf(`{"id":"%s-%d","tenant":%q,"lane":%q,"sent_ms":%d}`,
					tenant, sent[tenant], tenant, laneOf(tenant, sent[tenant]), time.Now().UnixMilli())
				if err := pub.Publish(context.Background(), "calls", stages.NewMessage("", []byte(payload), nil)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ticker.Stop()
	if err := pub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	total := int64(sent["hot"] + sent["cold"])
	waitFor(t, "every message to be delivered", func() bool {
		n, err := c.Universal().XLen(context.Background(), out).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n >= total
	})
	for _, p := range procs {
		p.kill(t)
	}
	// Which of hot's partitions each process took: the limit is shared when several did.
	keys := redis.Keys{Prefix: prefix}
	var sharing []string
	sharers := 0
	for i, p := range procs {
		took := 0
		for part, lane := range lanes {
			for _, line := range strings.Split(p.log.String(), "\n") {
				if lane != lanes[5] && strings.Contains(line, "partition taken") && strings.Contains(line, "stream="+keys.Stream("calls", part)) {
					took++
					break
				}
			}
		}
		sharing = append(sharing, fmt.Sprintf("process %d: %d", i+1, took))
		if took > 0 {
			sharers++
		}
	}
	if sharers < 2 {
		t.Errorf("hot's partitions were taken by %d process: its limit was not shared", sharers)
	}

	// When each message was delivered, by tenant, in Unix ms; and each exactly once.
	delivered := map[string][]int64{}
	var coldWaits []int64
	seen := map[string]int{}
	for _, r := range readAll(t, c, out) {
		var v struct {
			ID, Tenant string
			SentMS     int64 `json:"sent_ms"`
		}
		if err := json.Unmarshal(r.Payload, &v); err != nil {
			t.Fatal(err)
		}
		seen[v.ID]++
		ms, _, _ := strings.Cut(r.ID, "-")
		at, err := strconv.ParseInt(ms, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		delivered[v.Tenant] = append(delivered[v.Tenant], at)
		if v.Tenant == "cold" && v.SentMS >= begin.Add(window).UnixMilli() {
			coldWaits = append(coldWaits, at-v.SentMS) // after the first window, as hot's pace
		}
	}
	for tenant, n := range sent {
		for i := range n {
			if id := fmt.Sprintf("%s-%d", tenant, i); seen[id] != 1 {
				t.Errorf("%s delivered %d times, want once", id, seen[id])
			}
		}
	}

	// Hot's pace: 5 s windows from its first delivery, while its backlog lasts (it is sent faster
	// than its limit, so the backlog grows all through the load), the first left out (the
	// processes take their partitions, and the burst goes at once).
	hot := delivered["hot"]
	slices.Sort(hot)
	first, last := hot[0], hot[len(hot)-1]
	want := float64(rate) * window.Seconds()
	var figures []string
	for start := first + window.Milliseconds(); start+window.Milliseconds() <= last; start += window.Milliseconds() {
		lo, _ := slices.BinarySearch(hot, start)
		hi, _ := slices.BinarySearch(hot, start+window.Milliseconds())
		got := float64(hi-lo) / window.Seconds()
		figures = append(figures, fmt.Sprintf("%.1f", got))
		if n := float64(hi - lo); n < want*0.95 || n > want*1.05 {
			t.Errorf("hot: %.0f delivered in the window %s-%s after its first, %.1f/s, want %d/s within 5%%",
				n, time.Duration(start-first)*time.Millisecond, time.Duration(start-first)*time.Millisecond+window, got, rate)
		}
	}
	if len(figures) < 5 {
		t.Errorf("hot's backlog lasted %d windows of %s after the first, want at least 5", len(figures), window)
	}
	// Cold's: delivered soon after it was sent, not at hot's pace.
	slices.Sort(coldWaits)
	q := func(p float64) int64 { return coldWaits[int(p*float64(len(coldWaits)-1))] }
	t.Logf("hot: %d sent at %d/s, delivered at %s per second in the 5 s windows after the first (%.1f/s from first to last)",
		sent["hot"], hotRate, strings.Join(figures, ", "), float64(len(hot)-1)/(float64(last-first)/1000))
	t.Logf("hot's five partitions taken by %s", strings.Join(sharing, ", "))
	t.Logf("cold: %d sent at %d/s, each delivered (after the first %s) p50 %dms, p99 %dms, at most %dms after it was sent",
		sent["cold"], coldRate, window, q(0.5), q(0.99), q(1))
	if p99 := time.Duration(q(0.99)) * time.Millisecond; p99 > 2*time.Second {
		t.Errorf("cold's messages waited %s (p99): held back by hot's limit", p99)
	}
}
