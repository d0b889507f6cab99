package cmd

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime/admin"
	redis "github.com/flowrun/flowrun/transport/redis"
)

func parseInspect(t *testing.T, out string) admin.Report {
	t.Helper()
	var r admin.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("inspect --json printed %v:\n%s", err, out)
	}
	return r
}

func topicOf(t *testing.T, r admin.Report, name string) admin.TopicReport {
	t.Helper()
	for _, tr := range r.Topics {
		if tr.Name == name {
			return tr
		}
	}
	t.Fatalf("no topic %s in %+v", name, r.Topics)
	return admin.TopicReport{}
}

func groupOn(t *testing.T, p admin.PartitionReport, group string) admin.GroupReport {
	t.Helper()
	for _, g := range p.Groups {
		if g.Group == group {
			return g
		}
	}
	t.Fatalf("partition %d has no group %s: %+v", p.Partition, group, p.Groups)
	return admin.GroupReport{}
}

func TestInspect(t *testing.T) {
	srv := redistest.Shared(t)
	ctx := testContext(t)
	path, prefix := testPipeline(t, ordersPipeline)
	keys := redis.Keys{Prefix: prefix}
	if code, _, errOut := runIn(t, orderLines(20, 20), "produce", "--redis", srv.URL(), path, "orders"); code != ExitOK {
		t.Fatalf("produce: exit %d\n%s", code, errOut)
	}
	rdb := srv.Client(t)
	lens := make([]int64, 3)
	for p := range lens {
		lens[p] = rdb.XLen(ctx, keys.Stream("orders", p)).Val()
		if lens[p] < 2 {
			t.Fatalf("partition %d has %d entries; the test needs 2 in each", p, lens[p])
		}
	}
	// The runtime is not there yet: play the stage enrich by hand. Its group exists on
	// partitions 0 and 1; on partition 0 a consumer read 2 entries and acked none. A group that
	// the pipeline does not have (a removed stage) reads partition 1.
	for _, p := range []int{0, 1} {
		if err := rdb.XGroupCreate(ctx, keys.Stream("orders", p), "enrich", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XGroupCreate(ctx, keys.Stream("orders", 1), "old_stage", "$").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: "enrich", Consumer: "w1", Streams: []string{keys.Stream("orders", 0), ">"}, Count: 2, Block: -1,
	}).Err(); err != nil {
		t.Fatal(err)
	}
	c, err := redis.Open(ctx, redis.Options{URLs: []string{srv.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok, err := c.AcquireLease(ctx, keys.Lease("orders", 0, "enrich"), "worker-1@host", time.Minute); err != nil || !ok {
		t.Fatalf("lease: %v %v", ok, err)
	}
	xadd(t, rdb, keys.DeadLetter("audit"), "payload", `{}`)
	xadd(t, rdb, keys.DeadLetter("audit"), "payload", `{}`)
	if err := rdb.ZAdd(ctx, keys.Retry("orders", 0, "enrich"), goredis.Z{Score: 1, Member: "x"}).Err(); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runIn(t, "", "inspect", "--json", "--redis", srv.URL(), path)
	if code != ExitOK {
		t.Fatalf("inspect --json: exit %d\n%s", code, errOut)
	}
	r := parseInspect(t, out)
	if r.KeyPrefix != prefix || r.Redis != "redis://"+srv.Addr() || len(r.Topics) != 3 {
		t.Fatalf("report: %+v", r)
	}
	orders := topicOf(t, r, "orders")
	if orders.Length != 20 || len(orders.Partitions) != 3 {
		t.Fatalf("orders: %+v", orders)
	}
	for p, pr := range orders.Partitions {
		if pr.Partition != p || !pr.Exists || pr.Length != lens[p] || pr.FirstID == "" || pr.LastID == "" || pr.Stream != keys.Stream("orders", p) {
			t.Errorf("partition %d: %+v", p, pr)
		}
	}
	g0 := groupOn(t, orders.Partitions[0], "enrich")
	if !g0.Exists || g0.Reader != "stage.enrich" || g0.Lag != lens[0]-2 || !g0.LagExact || g0.Pending != 2 || g0.Consumers != 1 ||
		g0.OldestPendingID == "" || g0.OldestPendingDeliveries != 1 || g0.OldestPendingAgeMS < 0 || g0.ScheduledRetries != 1 {
		t.Errorf("enrich on partition 0: %+v", g0)
	}
	if g0.Lease == nil || g0.Lease.Owner != "worker-1@host" || g0.Lease.Token < 1 || g0.Lease.TTLMS <= 0 {
		t.Errorf("lease on partition 0: %+v", g0.Lease)
	}
	if g1 := groupOn(t, orders.Partitions[1], "enrich"); !g1.Exists || g1.Lag != lens[1] || g1.Pending != 0 || g1.Lease != nil {
		t.Errorf("enrich on partition 1: %+v", g1)
	}
	if g := groupOn(t, orders.Partitions[1], "old_stage"); !g.Exists || g.Reader != "" || g.Lag != 0 {
		t.Errorf("old_stage on partition 1: %+v", g)
	}
	if g2 := groupOn(t, orders.Partitions[2], "enrich"); g2.Exists || g2.Lag != 0 || g2.Reader != "stage.enrich" {
		t.Errorf("enrich on partition 2 (no group yet): %+v", g2)
	}
	// Topics that nobody wrote to are empty, with groups that do not exist yet.
	for _, pr := range topicOf(t, r, "events").Partitions {
		if pr.Exists || pr.Length != 0 || len(pr.Groups) != 1 || pr.Groups[0].Exists || pr.Groups[0].Reader != "sink.audit" {
			t.Errorf("events partition %d: %+v", pr.Partition, pr)
		}
	}
	readers := map[string]admin.ReaderReport{}
	for _, rd := range r.Readers {
		readers[rd.Kind+"."+rd.Name] = rd
	}
	if e := readers["stage.enrich"]; len(r.Readers) != 3 || e.Input != "orders" || e.Lag != lens[0]-2+lens[1] || e.Pending != 2 ||
		e.ScheduledRetries != 1 || e.DeadLetters != 0 || e.DeadLetterTopic != "failed" || e.DeadLetterStream != keys.DeadLetter("enrich") {
		t.Errorf("readers: %+v", r.Readers)
	}
	if a := readers["sink.audit"]; a.DeadLetters != 2 || a.Input != "events" || a.Lag != 0 {
		t.Errorf("sink.audit: %+v", a)
	}

	// The table says the same.
	code, out, errOut = runIn(t, "", "inspect", "--redis", srv.URL(), path)
	if code != ExitOK {
		t.Fatalf("inspect: exit %d\n%s", code, errOut)
	}
	for _, want := range []string{
		"pipeline p", "key prefix " + prefix,
		"TOPIC", "LAST ID", "GROUP", "LAG", "PENDING", "LEASE", "READER", "DEAD LETTERS",
		"worker-1@host#", "no consumer group yet", "not in this pipeline", "old_stage",
		"dead letters go to topic failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "stage.enrich  orders") && strings.Contains(line, " 0 ") && strings.Contains(line, "worker-1@host") {
			if fields := strings.Fields(line); fields[3] != itoa(lens[0]-2) || fields[4] != "2" {
				t.Errorf("row of partition 0: %q", line)
			}
		}
		if strings.HasSuffix(line, " ") {
			t.Errorf("trailing white space in %q", line)
		}
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// sourcesPipeline has one source of every kind and a stage.
const sourcesPipeline = `
topic "in" { partitions = 2 }

source "gen" {
  kind     = "generate"
  output   = topic.in
  template = { n = index }
}

source "lines" {
  kind   = "file"
  path   = "/dev/null"
  output = topic.in
}

source "typed" {
  kind   = "stdin"
  output = topic.in
}

source "ext" {
  kind   = "redis_stream"
  stream = "EXTERNAL"
  output = topic.in
}

sink "out" {
  kind  = "stdout"
  input = topic.in
}
`

// The runtime is not there: play two processes by hand. proc-a holds the generate source's lease
// and partition 1 of sink out; proc-b holds the redis_stream source's lease; proc-dead stopped
// renewing its membership.
func TestInspectProcessesAndSourceLeases(t *testing.T) {
	for name, urls := range map[string][]string{
		"server":  {redistest.Shared(t).URL()},
		"cluster": redistest.SharedCluster(t, 3).URLs(),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			path, prefix := testPipeline(t, sourcesPipeline)
			external := prefix + ":external{ext}"
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(strings.Replace(string(src), "EXTERNAL", external, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			keys := redis.Keys{Prefix: prefix}
			c, err := redis.Open(ctx, redis.Options{URLs: urls})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var redisArgs []string
			for _, u := range urls {
				redisArgs = append(redisArgs, "--redis", u)
			}
			inspectJSON := func() admin.Report {
				t.Helper()
				code, out, errOut := runIn(t, "", append([]string{"inspect", "--json"}, append(redisArgs, path)...)...)
				if code != ExitOK {
					t.Fatalf("inspect --json: exit %d\n%s", code, errOut)
				}
				return parseInspect(t, out)
			}

			// Nothing ran yet.
			r := inspectJSON()
			if len(r.Processes) != 0 || len(r.Sources) != 4 {
				t.Fatalf("before any process: processes %+v, sources %+v", r.Processes, r.Sources)
			}
			for _, s := range r.Sources {
				if s.Lease != nil || s.LeaseError != "" || s.Output != "in" {
					t.Errorf("source %s before any process: %+v", s.Name, s)
				}
			}

			for id, ttl := range map[string]time.Duration{"proc-a": time.Minute, "proc-b": time.Hour} {
				if _, err := c.Heartbeat(ctx, []string{keys.Members()}, id, ttl); err != nil {
					t.Fatal(err)
				}
			}
			if err := heartbeatLapsed(ctx, c, keys.Members(), "proc-dead"); err != nil {
				t.Fatal(err)
			}
			for key, owner := range map[string]string{
				keys.SourceLease("gen"):           "proc-a",
				keys.Lease("in", 1, "out"):        "proc-a",
				keys.StreamLease(external, "ext"): "proc-b",
			} {
				if _, ok, err := c.AcquireLease(ctx, key, owner, time.Minute); err != nil || !ok {
					t.Fatalf("lease %s: %v %v", key, ok, err)
				}
			}

			r = inspectJSON()
			procs := map[string]admin.ProcessReport{}
			for _, p := range r.Processes {
				procs[p.ID] = p
			}
			if len(r.Processes) != 2 || r.Processes[0].ID != "proc-a" || r.Processes[1].ID != "proc-b" {
				t.Fatalf("processes: %+v (want proc-a, then proc-b, and not proc-dead)", r.Processes)
			}
			if a := procs["proc-a"]; a.Leases != 2 || a.ExpiresInMS <= 0 || a.ExpiresInMS > time.Minute.Milliseconds() {
				t.Errorf("proc-a: %+v", a)
			}
			if b := procs["proc-b"]; b.Leases != 1 || b.ExpiresInMS <= time.Minute.Milliseconds() {
				t.Errorf("proc-b: %+v", b)
			}
			sources := map[string]admin.SourceReport{}
			for _, s := range r.Sources {
				sources[s.Name] = s
			}
			if s := sources["gen"]; s.Kind != "generate" || s.LeaseKey != keys.SourceLease("gen") || s.Lease == nil ||
				s.Lease.Owner != "proc-a" || s.Lease.Token < 1 || s.Lease.TTLMS <= 0 {
				t.Errorf("gen: %+v %+v", s, s.Lease)
			}
			if s := sources["lines"]; s.Kind != "file" || s.LeaseKey != keys.SourceLease("lines") || s.Lease != nil {
				t.Errorf("lines: %+v", s)
			}
			if s := sources["typed"]; s.Kind != "stdin" || s.LeaseKey != "" || s.Lease != nil {
				t.Errorf("typed: %+v", s)
			}
			if s := sources["ext"]; s.Kind != "redis_stream" || s.LeaseKey != keys.StreamLease(external, "ext") || s.Lease == nil || s.Lease.Owner != "proc-b" {
				t.Errorf("ext: %+v %+v", s, s.Lease)
			}

			code, out, errOut := runIn(t, "", append([]string{"inspect"}, append(redisArgs, path)...)...)
			if code != ExitOK {
				t.Fatalf("inspect: exit %d\n%s", code, errOut)
			}
			for _, want := range []string{
				"PROCESS", "MEMBERSHIP LAPSES IN", "SOURCE", "source.gen", "proc-a#", "proc-b#", "every process runs it",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("table lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "proc-dead") {
				t.Errorf("table shows a lapsed process:\n%s", out)
			}
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) > 0 && f[0] == "proc-a" && (len(f) != 3 || f[2] != "2") {
					t.Errorf("proc-a's row: %q", line)
				}
			}
		})
	}
}

// heartbeatLapsed adds a member whose membership lapsed a second ago, as a process that died
// leaves it until another one's heartbeat forgets it.
func heartbeatLapsed(ctx context.Context, c *redis.Client, key, id string) error {
	return c.Universal().ZAdd(ctx, key, goredis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: id}).Err()
}

// inspect --state shows what a dedupe stage remembers per partition: its watermark, its keys (of
// its max_keys) and their timers.
func TestInspectState(t *testing.T) {
	srv := redistest.Shared(t)
	path, _ := testPipeline(t, `
topic "orders" {
  partitions = 2
  key        = msg.order_id
}

source "gen" {
  kind   = "generate"
  count  = 40
  output = topic.orders
  template = {
    order_id = "o${floor(index / 2) % 8}"
    at       = floor(index / 2) * 60000
  }
}

stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.order_id
  within     = "5m"
  event_time = msg.at
  max_keys   = 100
}

sink "out" {
  kind  = "stdout"
  input = stage.once
}
`)
	if code, out, errOut := run(t, "run", "--until-drained", "--redis", srv.URL(), path); code != ExitOK || strings.Count(out, "\n") != 20 {
		t.Fatalf("run: exit %d, want 20 lines out of 40 pairs\n%s%s", code, out, errOut)
	}
	code, out, errOut := run(t, "inspect", "--json", "--redis", srv.URL(), path)
	if code != ExitOK {
		t.Fatalf("inspect: exit %d\n%s", code, errOut)
	}
	r := parseInspect(t, out)
	if len(r.State) != 2 {
		t.Fatalf("state of %d partitions, want 2: %+v", len(r.State), r.State)
	}
	keys := int64(0)
	for _, s := range r.State {
		// Each key is remembered for 5 minutes of event time; a pair comes every minute, so a
		// partition remembers the keys of its last few minutes, each with its timer, in records of
		// the keys of a batch each (entries).
		if s.Stage != "once" || s.Watermark == "" || s.Keys == 0 || s.Timers != s.Keys || s.Entries < 1 || s.Entries > s.Keys || s.MaxKeys != 100 || s.Bytes <= 0 {
			t.Errorf("partition %d: %+v", s.Partition, s)
		}
		keys += s.Keys
	}
	if keys >= 8 {
		t.Errorf("%d keys remembered: the keys whose time is up were not forgotten", keys)
	}
	code, out, _ = run(t, "inspect", "--state", "--redis", srv.URL(), path)
	if code != ExitOK || !strings.Contains(out, "WATERMARK") || !strings.Contains(out, "orders[1]") || !strings.Contains(out, " of 100") {
		t.Fatalf("inspect --state: exit %d\n%s", code, out)
	}
}
