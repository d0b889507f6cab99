package admin

import (
	"os"
	"regexp"
	"strings"
	"testing"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// Every key that Keys names is one that reset recognises, with the node it belongs to.
func TestClassifyKnowsEveryKey(t *testing.T) {
	k := redis.Keys{Prefix: "flow:x"}
	lease := k.Lease("orders", 3, "enrich")
	cases := []struct{ key, node, what string }{
		{k.Stream("orders", 3), "", "topic partition"},
		{k.Stream("enrich.by_key", 0), "", "topic partition"},
		{lease, "enrich", "lease"},
		{redis.LeaseFence(lease), "enrich", "lease fence"},
		{redis.LeaseCommit(lease), "enrich", "commit record"},
		{k.Retry("orders", 3, "enrich"), "enrich", "retries"},
		{k.State("orders", 3, "customers.table"), "customers.table", "state"},
		{k.Timers("orders", 3, "enrich"), "enrich", "timers"},
		{k.Holds("orders", 3, "enrich"), "enrich", "holds"},
		{k.StatePartitions("orders", "enrich"), "enrich", "state partition count"},
		{k.StateFingerprint("orders", "enrich"), "enrich", "state fingerprint"},
		{k.Dedup("events", 1, "enrich", "orders", 3, "1-0", 0), "enrich", "dedup marker"},
		{k.StreamDedup("demo:events", "hook", "orders", 3, "1-0"), "hook", "dedup marker"},
		{k.DeadLetter("enrich"), "enrich", "dead letters"},
		{k.Replayed(k.DeadLetter("enrich")), "enrich", "replay marks"},
		{k.Members(), "", "membership"},
		{k.NodeMembers("enrich"), "enrich", "membership"},
		{k.SourceLease("clicks"), "clicks", "source lease"},
		{redis.LeaseFence(k.SourceLease("clicks")), "clicks", "lease fence"},
		{k.SourcePosition("clicks"), "clicks", "source position"},
		{k.SourceUpstreamLag("clicks"), "clicks", "upstream lag"},
		{k.StreamLease("demo:events:orders", "orders_in"), "orders_in", "lease"},
		{redis.LeaseFence(k.StreamLease("demo:events:orders", "orders_in")), "orders_in", "lease fence"},
		{k.RateLimit("throttle", "customer:{7}"), "throttle", "rate limit"},
		{k.Prefix + ":{orders:3}:watermarks", "", "watermarks"},
		{redis.PayloadKey(k.Stream("orders", 3), "a1-p2"), "", "offloaded payload"},
		{redis.PayloadIndex(k.Stream("orders", 3)), "", "payload index"},
		{redis.PayloadKey(k.DeadLetter("enrich"), "a1-p2"), "enrich", "offloaded payload"},
		{redis.PayloadIndex(k.DeadLetter("enrich")), "enrich", "payload index"},
	}
	for _, c := range cases {
		node, what, stream, ok := classify(strings.TrimPrefix(c.key, k.Prefix+":"))
		topicData := c.what == "topic partition" || c.node == "" && strings.Contains(c.what, "payload")
		if !ok || node != c.node || what != c.what || stream != topicData {
			t.Errorf("%s: node %q, %q, stream %v, ok %v; want node %q, %q", c.key, node, what, stream, ok, c.node, c.what)
		}
	}
	for _, other := range []string{"b:{orders:3}", "cache:users", "{orders}", "{orders:3}:other:enrich", "dlq:{enrich}:x", "source:{clicks}:other"} {
		if node, what, _, ok := classify(other); ok {
			t.Errorf("%s: taken as %q of %q; flowrun writes no such key", other, what, node)
		}
	}
}

// Every key docs/redis-keys.md lists is one that reset recognises: a key added there without
// teaching reset fails here.
func TestClassifyKnowsTheDocumentedKeys(t *testing.T) {
	doc, err := os.ReadFile("../../docs/redis-keys.md")
	if err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("<dead-letter stream>", "flow:dlq:{enrich}", "<prefix>", "flow",
		"<topic>", "orders", "<p>", "3", "<stage>", "enrich", "<out>", "events", "<q>", "1", "<in>", "orders",
		"<id>", "1-0", "<n>", "0", "<tag>", "demo:events", "<sink>", "hook", "<key>", "k1", "<node>", "enrich",
		"<source>", "clicks", "<token>", "a1-p2")
	rows := regexp.MustCompile("(?m)^\\| `(<[^`]+)` \\|").FindAllSubmatch(doc, -1)
	if len(rows) < 20 {
		t.Fatalf("found %d keys in the table of docs/redis-keys.md; its layout changed", len(rows))
	}
	for _, row := range rows {
		key := fill.Replace(string(row[1]))
		if strings.Contains(key, "<") {
			t.Errorf("%s: a placeholder this test does not fill", row[1])
			continue
		}
		if _, _, _, ok := classify(strings.TrimPrefix(key, "flow:")); !ok {
			t.Errorf("%s (%s): reset does not recognise it", row[1], key)
		}
	}
}
