package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// reloadVersion is one definition of the pipeline that the reload tests change while it runs.
type reloadVersion struct {
	filter int  // the filter's version: tag stamps it as v, keep drops the messages whose n%10 is filter%10
	sink   int  // the file the sink writes, out-<sink>.jsonl
	extra  bool // the pipeline has a second branch, extra -> extra_out, that reads the input from its start
}

// source is the pipeline's text in this version.
func (v reloadVersion) source(dir string) string {
	src := fmt.Sprintf(`
pipeline "reload" {}
topic "in" {
  partitions = 4
  key        = msg.k
}
stage "tag" {
  kind  = "map"
  input = topic.in
  set   = { v = %d }
}
stage "keep" {
  kind  = "filter"
  input = stage.tag
  where = msg.n %% 10 != %d
}
sink "out" {
  kind  = "file"
  input = stage.keep
  path  = %q
}
`, v.filter, v.filter%10, filepath.Join(dir, fmt.Sprintf("out-%d.jsonl", v.sink)))
	if v.extra {
		src += fmt.Sprintf(`
stage "extra" {
  kind  = "map"
  input = topic.in
  set   = { extra = true }
}
sink "extra_out" {
  kind  = "file"
  input = stage.extra
  path  = %q
}
`, filepath.Join(dir, "extra.jsonl"))
	}
	return src
}

// reloadPlan compiles a version of the pipeline under a key prefix shared by the versions.
func reloadPlan(t *testing.T, src, prefix string) *flow.Plan {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pipeline.hcl")
	writeFile(t, path, src)
	plan, _, diags := flow.Build(path, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	plan.KeyPrefix = prefix
	return plan
}

// nodeTotals sums what each node did across its definitions: those that ended in reloads and the
// one that runs now.
type nodeTotals map[string]runtime.NodeSummary

func (nt nodeTotals) add(ns runtime.NodeSummary) {
	t := nt[ns.Name]
	t.Name = ns.Name
	t.In += ns.In
	t.Out += ns.Out
	t.Filtered += ns.Filtered
	t.DeadLettered += ns.DeadLettered
	nt[ns.Name] = t
}

// with returns the totals with the running nodes' counts added.
func (nt nodeTotals) with(running []runtime.NodeSummary) nodeTotals {
	out := nodeTotals{}
	for _, ns := range nt {
		out.add(ns)
	}
	for _, ns := range running {
		out.add(ns)
	}
	return out
}

// TestReloadUnderLoad publishes messages in chunks and reloads the pipeline after each chunk, while
// the chunk is processed: changing the filter (with the version that tag stamps), changing the sink's
// path, adding a branch. Each message must then be in the output exactly once, stamped with a filter
// version that lets it through, or counted as filtered by the filter, once, by a version that drops
// it; the added branch must see every message once (its group starts at the topic's beginning).
// Unchanged nodes keep their leases (the same fencing tokens) through each reload. With -soak, 100k
// messages and 10 reloads.
func TestReloadUnderLoad(t *testing.T) {
	messages, reloads := 4000, 4
	if *soakFlag {
		messages, reloads = 100_000, 10
	}
	c := server.open(t)
	dir := t.TempDir()
	prefix := "t" + itoa(prefixes.Add(1)) + "-reload"
	v := reloadVersion{}
	svc := startService(t, c, reloadPlan(t, v.source(dir), prefix), runtime.Options{BatchSize: 100})
	pub, err := runtime.NewPublisher(c, svc.rt.Plan())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close(context.Background()) }()
	ctx := context.Background()
	ended := nodeTotals{}
	used := map[int]bool{0: true} // the filter versions that ran
	chunk := messages / (reloads + 1)
	next := 0
	publish := func(upTo int) {
		var batch []stages.Message
		for ; next < upTo; next++ {
			batch = append(batch, stages.Message{Key: fmt.Sprintf("k%d", next%37),
				Value: map[string]any{"k": fmt.Sprintf("k%d", next%37), "n": next}})
			if len(batch) == 500 {
				if err := pub.PublishBatch(ctx, "in", batch); err != nil {
					t.Fatal(err)
				}
				batch = nil
			}
		}
		if err := pub.PublishBatch(ctx, "in", batch); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= reloads; i++ {
		publish(i * chunk)
		unchanged := "sink.out"
		switch {
		case i == 2:
			v.extra = true
		case i%2 == 1:
			v.filter++
			used[v.filter] = true
		default:
			v.sink++
			unchanged = "stage.keep"
		}
		before := leaseValues(t, c, svc.rt.Plan(), unchanged)
		inFlight := int64(next) - ended.with(svc.rt.Snapshot().Nodes)["tag"].In
		rep, err := svc.rt.Reload(ctx, reloadPlan(t, v.source(dir), prefix))
		if err != nil {
			t.Fatalf("reload %d: %v\n%s", i, err, svc.log.String())
		}
		if !rep.Changed() {
			t.Fatalf("reload %d changed nothing: %+v", i, rep)
		}
		var endedNames []string
		for _, ns := range rep.Ended {
			ended.add(ns)
			endedNames = append(endedNames, ns.Type+"."+ns.Name)
		}
		if strings.Join(endedNames, ",") != strings.Join(append(rep.Restarted, rep.Stopped...), ",") {
			t.Errorf("reload %d: the nodes that ended are %v; it restarted %v and stopped %v", i, endedNames, rep.Restarted, rep.Stopped)
		}
		t.Logf("reload %d: %d of %d messages published were not read yet; restarted %v, started %v", i, inFlight, next, rep.Restarted, rep.Started)
		if i != 2 {
			if after := leaseValues(t, c, svc.rt.Plan(), unchanged); after != before || before == "" {
				t.Errorf("reload %d: the leases of %s, which did not change, went from %q to %q", i, unchanged, before, after)
			}
		}
	}
	publish(messages)
	var totals nodeTotals
	waitFor(t, "every message to be processed", func() bool {
		totals = ended.with(svc.rt.Snapshot().Nodes)
		return totals["tag"].In == int64(messages) && totals["keep"].Out+totals["keep"].Filtered == int64(messages) &&
			totals["out"].Out == totals["keep"].Out && totals["extra_out"].Out == int64(messages)
	})
	svc.stop()

	// The output: each message once, let through by the filter version it carries.
	out := map[int]int{}
	for s := 0; s <= v.sink; s++ {
		for _, m := range jsonLines(t, readFileIfAny(t, filepath.Join(dir, fmt.Sprintf("out-%d.jsonl", s)))) {
			n, ver := int(m["n"].(float64)), int(m["v"].(float64))
			out[n]++
			if !used[ver] {
				t.Fatalf("message %d carries filter version %d, which never ran", n, ver)
			}
			if n%10 == ver%10 {
				t.Errorf("message %d went through filter version %d, which drops it", n, ver)
			}
		}
	}
	missing := 0
	for n := 0; n < messages; n++ {
		switch out[n] {
		case 0:
			missing++
			dropped := false
			for ver := range used {
				dropped = dropped || n%10 == ver%10
			}
			if !dropped {
				t.Errorf("message %d is missing, and no filter version drops it", n)
			}
		case 1:
		default:
			t.Errorf("message %d is in the output %d times", n, out[n])
		}
	}
	if int64(missing) != totals["keep"].Filtered {
		t.Errorf("%d messages are missing from the output, and the filter's versions filtered %d", missing, totals["keep"].Filtered)
	}
	if dups := tally(t, countBy(t, jsonLines(t, readFile(t, filepath.Join(dir, "extra.jsonl"))), "n"), messages); dups > 0 {
		t.Errorf("the added branch wrote %d messages twice", dups)
	}
	t.Logf("%d messages, %d reloads: %d out, %d filtered by versions %v", messages, reloads, len(out), missing, used)
}

// leaseValues returns the leases (owner and fencing token) that a node holds on its input's
// partitions, joined; "" when it misses any. keep runs fused in tag's hop, whose leases are tag's.
func leaseValues(t *testing.T, c *redis.Client, plan *flow.Plan, addr string) string {
	t.Helper()
	input, holder := "in", "tag"
	if addr == "sink.out" {
		input, holder = "keep.out", "out"
	}
	k := redis.Keys{Prefix: plan.KeyPrefix}
	var vals []string
	for p := range plan.Topic(input).Partitions {
		l, _, held, err := c.LeaseHolder(context.Background(), k.Lease(input, p, holder))
		if err != nil || !held {
			return ""
		}
		vals = append(vals, fmt.Sprintf("%s#%d", l.Owner, l.Token))
	}
	return strings.Join(vals, ",")
}

// statefulSource is an aggregate whose window size and grace the state fingerprint test changes.
func statefulSource(size, grace string) string {
	return fmt.Sprintf(`
pipeline "fingerprint" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
topic "counts" {}
stage "count" {
  kind     = "aggregate"
  input    = topic.in
  output   = topic.counts
  group_by = msg.k
  grace    = %q
  window {
    type = "tumbling"
    size = %q
  }
  aggregate = { n = count() }
}
sink "out" {
  kind  = "stdout"
  input = topic.counts
}
`, grace, size)
}

// TestReloadRefusesAStatefulChange: a change of an aggregate that keeps its state meaningful (grace)
// restarts it; one that does not (the window's size) is refused, on a reload as on a start, unless
// ResetState names the stage, which then starts with its state deleted.
func TestReloadRefusesAStatefulChange(t *testing.T) {
	c := server.open(t)
	prefix := "t" + itoa(prefixes.Add(1)) + "-fingerprint"
	k := redis.Keys{Prefix: prefix}
	ctx := context.Background()
	svc := startService(t, c, reloadPlan(t, statefulSource("1m", "0s"), prefix), runtime.Options{})
	pub, err := runtime.NewPublisher(c, svc.rt.Plan())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close(context.Background()) }()
	msgs := []stages.Message{{Key: "a", Value: map[string]any{"k": "a"}}, {Key: "b", Value: map[string]any{"k": "b"}}}
	if err := pub.PublishBatch(ctx, "in", msgs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the aggregate to take the messages in", func() bool { return absorbed(svc.rt, "count") == 2 })
	fingerprint, shape, found, err := c.RecordedFingerprint(ctx, k.StateFingerprint("in", "count"))
	if err != nil || !found || !strings.Contains(shape, `size = "1m"`) {
		t.Fatalf("the recorded fingerprint: %q %q %v %v", fingerprint, shape, found, err)
	}

	rep, err := svc.rt.Reload(ctx, reloadPlan(t, statefulSource("1m", "5s"), prefix))
	if err != nil || strings.Join(rep.Restarted, ",") != "stage.count" || len(rep.StateReset) > 0 {
		t.Fatalf("a change of grace: %+v, %v", rep, err)
	}
	_, err = svc.rt.Reload(ctx, reloadPlan(t, statefulSource("5m", "5s"), prefix))
	var refused *runtime.ReloadError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "stage count") || !strings.Contains(err.Error(), `size = "5m"`) ||
		!strings.Contains(err.Error(), "--reset-state") {
		t.Fatalf("a change of the window: %v", err)
	}
	// Refused, the old definition goes on, with its state.
	if err := pub.PublishBatch(ctx, "in", msgs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the aggregate to go on", func() bool { return absorbed(svc.rt, "count") == 2 }) // restarted by the grace change: counts anew
	if held := stateHeld(t, c, k); !held {
		t.Fatal("the aggregate's state is gone")
	}
	svc.stop()

	// A process started on the changed definition refuses the same way.
	changed := reloadPlan(t, statefulSource("5m", "5s"), prefix)
	_, err = runtime.Run(ctx, changed, runtime.Options{Redis: c, Logger: newLogger(&syncBuffer{}), UntilDrained: true})
	var configErr *runtime.ConfigError
	if !errors.As(err, &configErr) || !strings.Contains(err.Error(), "keeps state for another definition") {
		t.Fatalf("a start on the changed definition: %v", err)
	}
	// With ResetState, it starts: the state is deleted, the new fingerprint recorded.
	svc = startService(t, c, changed, runtime.Options{ResetState: []string{"count"}})
	if held := stateHeld(t, c, k); held {
		t.Error("the state of the old definition is still there")
	}
	if _, shape, _, _ := c.RecordedFingerprint(ctx, k.StateFingerprint("in", "count")); !strings.Contains(shape, `size = "5m"`) {
		t.Errorf("the new fingerprint is not recorded: %q", shape)
	}
	if !strings.Contains(svc.log.String(), "--reset-state") {
		t.Errorf("the deletion is not logged:\n%s", svc.log.String())
	}
}

// absorbed is what a node of a running pipeline took into its state.
func absorbed(rt *runtime.Runtime, name string) int64 {
	for _, n := range rt.Snapshot().Nodes {
		if n.Name == name {
			return n.Absorbed
		}
	}
	return -1
}

// stateHeld reports whether the aggregate count holds state on any partition of topic in.
func stateHeld(t *testing.T, c *redis.Client, k redis.Keys) bool {
	t.Helper()
	held, err := c.StateHeld(context.Background(), []string{k.State("in", 0, "count"), k.State("in", 1, "count")},
		[]string{k.Timers("in", 0, "count"), k.Timers("in", 1, "count")})
	if err != nil {
		t.Fatal(err)
	}
	return held[0] || held[1]
}

// TestReloadRefusesWhatItCannotChange: a new partition count of a topic is refused with the
// topic's name, and the pipeline goes on as it was.
func TestReloadRefusesWhatItCannotChange(t *testing.T) {
	c := server.open(t)
	dir := t.TempDir()
	prefix := "t" + itoa(prefixes.Add(1)) + "-refuse"
	v := reloadVersion{}
	svc := startService(t, c, reloadPlan(t, v.source(dir), prefix), runtime.Options{})
	src := strings.Replace(v.source(dir), "partitions = 4", "partitions = 8", 1)
	_, err := svc.rt.Reload(context.Background(), reloadPlan(t, src, prefix))
	var refused *runtime.ReloadError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "topic in") || !strings.Contains(err.Error(), "partitions 4, now 8") {
		t.Fatalf("a new partition count: %v", err)
	}
	if got := svc.rt.Plan().Topic("in").Partitions; got != 4 {
		t.Errorf("the plan that runs has %d partitions", got)
	}
	rep, err := svc.rt.Reload(context.Background(), reloadPlan(t, v.source(dir), prefix))
	if err != nil || rep.Changed() || len(rep.Unchanged) != 3 {
		t.Errorf("the same plan again: %+v, %v", rep, err)
	}
	_ = os.Remove(filepath.Join(dir, "out-0.jsonl"))
}

// TestReloadStopsARemovedBranch: a reload without the extra branch stops it; its consumer group
// stays on the input topic, for flowrun reset, and the log says so.
func TestReloadStopsARemovedBranch(t *testing.T) {
	c := server.open(t)
	dir := t.TempDir()
	prefix := "t" + itoa(prefixes.Add(1)) + "-remove"
	v := reloadVersion{extra: true}
	svc := startService(t, c, reloadPlan(t, v.source(dir), prefix), runtime.Options{})
	k := redis.Keys{Prefix: prefix}
	waitFor(t, "the branch to take its partitions", func() bool {
		_, _, held, err := c.LeaseHolder(context.Background(), k.Lease("in", 0, "extra"))
		return err == nil && held
	})
	v.extra = false
	rep, err := svc.rt.Reload(context.Background(), reloadPlan(t, v.source(dir), prefix))
	if err != nil || strings.Join(rep.Stopped, ",") != "stage.extra,sink.extra_out" || len(rep.Restarted)+len(rep.Started) > 0 {
		t.Fatalf("removing the branch: %+v, %v", rep, err)
	}
	// Stopped, it let its leases go at once (not when they lapse), and left its group.
	if _, _, held, err := c.LeaseHolder(context.Background(), k.Lease("in", 0, "extra")); err != nil || held {
		t.Errorf("the removed stage's lease: held %v, %v", held, err)
	}
	groups, err := c.Universal().XInfoGroups(context.Background(), k.Stream("in", 0)).Result()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range groups {
		found = found || g.Name == "extra"
	}
	if !found {
		t.Errorf("the removed stage's consumer group is gone: %+v", groups)
	}
	if log := svc.log.String(); !strings.Contains(log, "flowrun reset") || !strings.Contains(log, "--stage extra") {
		t.Errorf("the log does not say how to delete what the removed stage left:\n%s", log)
	}
	for _, n := range svc.rt.Snapshot().Nodes {
		if n.Name == "extra" || n.Name == "extra_out" {
			t.Errorf("the snapshot still shows %s", n.Name)
		}
	}
}
