package redis

import (
	"context"
	"fmt"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
)

func TestKeysLayout(t *testing.T) {
	k := Keys{Prefix: "flow"}
	cases := []struct{ got, want string }{
		{k.Stream("orders", 3), "flow:{orders:3}"},
		{k.Lease("orders", 3, "enrich"), "flow:{orders:3}:lease:enrich"},
		{LeaseFence(k.Lease("orders", 3, "enrich")), "flow:{orders:3}:lease:enrich:fence"},
		{k.Retry("orders", 3, "enrich"), "flow:{orders:3}:retry:enrich"},
		{k.Dedup("enriched", 5, "enrich", "orders", 3, "1700000000000-7", 0), "flow:{enriched:5}:dedup:enrich:orders:3:1700000000000-7:0"},
		{k.DeadLetter("enrich"), "flow:dlq:{enrich}"},
		{Group("enrich"), "enrich"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if got := k.Streams("orders", 3); fmt.Sprint(got) != "[flow:{orders:0} flow:{orders:1} flow:{orders:2}]" {
		t.Errorf("Streams = %v", got)
	}
}

func TestKeysShareTagsPerPartition(t *testing.T) {
	k := Keys{Prefix: "flow"}
	for p := range 16 {
		s := HashSlot(k.Stream("orders", p))
		for _, key := range []string{k.Lease("orders", p, "enrich"), LeaseFence(k.Lease("orders", p, "enrich")), k.Retry("orders", p, "enrich"), k.Dedup("orders", p, "x", "y", 0, "1-1", 0)} {
			if HashSlot(key) != s {
				t.Errorf("%s is not in the slot of its stream", key)
			}
		}
	}
	// Partitions spread over slots.
	slots := map[int]bool{}
	for p := range 16 {
		slots[HashSlot(k.Stream("orders", p))] = true
	}
	if len(slots) != 16 {
		t.Errorf("16 partitions use only %d slots", len(slots))
	}
}

func TestValidate(t *testing.T) {
	for _, ok := range []string{"flow", "a:b", "my-app.v2"} {
		if err := (Keys{Prefix: ok}).Validate(); err != nil {
			t.Errorf("prefix %q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a{b", "x}", "a b"} {
		if err := (Keys{Prefix: bad}).Validate(); err == nil {
			t.Errorf("prefix %q accepted", bad)
		}
	}
	for _, ok := range []string{"orders", "_x", "a-1", "Enrich_2"} {
		if err := ValidName(ok); err != nil {
			t.Errorf("name %q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1a", "-a", "a:b", "a{b}", "a b", "é"} {
		if err := ValidName(bad); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
}

func TestHashSlotMatchesRedis(t *testing.T) {
	if got := crc16("123456789"); got != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	cl := redistest.SharedCluster(t, 3)
	rdb := cl.Nodes()[0].Client(t)
	for _, key := range []string{"", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}", "flow:{orders:3}:lease:enrich", "é{🚀}"} {
		want, err := rdb.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := HashSlot(key); int64(got) != want {
			t.Errorf("HashSlot(%q) = %d, Redis says %d", key, got, want)
		}
	}
}

func TestCompareIDs(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{
		{"1-0", "1-0", 0}, {"1-1", "1-0", 1}, {"2-0", "10-0", -1}, {"5", "5-0", 0}, {"18446744073709551615-0", "1-0", 1},
	}
	for _, c := range cases {
		got, err := CompareIDs(c.a, c.b)
		if err != nil || got != c.want {
			t.Errorf("CompareIDs(%s, %s) = %d, %v; want %d", c.a, c.b, got, err, c.want)
		}
	}
	if _, err := CompareIDs("x", "1-0"); err == nil {
		t.Error("CompareIDs accepted x")
	}
	if got := (streamID{ms: 3, seq: ^uint64(0)}).next(); got != (streamID{ms: 4}) {
		t.Errorf("next of max seq = %v", got)
	}
}

func TestMaxID(t *testing.T) {
	cases := []struct {
		ids  []string
		want string
	}{
		{nil, ""}, {[]string{"5-1"}, "5-1"}, {[]string{"2-0", "10-0", "9-9"}, "10-0"},
		{[]string{"3-2", "3-10", "3-9"}, "3-10"}, {[]string{"7-0", "x", "6-0"}, "7-0"},
	}
	for _, c := range cases {
		if got := MaxID(c.ids); got != c.want {
			t.Errorf("MaxID(%q) = %q, want %q", c.ids, got, c.want)
		}
	}
}

func TestIDMillis(t *testing.T) {
	for id, want := range map[string]int64{"1700000000000-3": 1700000000000, "42": 42, "0-1": 0} {
		if got, err := IDMillis(id); err != nil || got != want {
			t.Errorf("IDMillis(%q) = %d, %v; want %d", id, got, err, want)
		}
	}
	for _, id := range []string{"", "x-1", "-1", "1-x", "18446744073709551615-0"} {
		if _, err := IDMillis(id); err == nil {
			t.Errorf("IDMillis(%q) accepted it", id)
		}
	}
}

func TestLeaseKeysShareTheirStreamsSlot(t *testing.T) {
	k := Keys{Prefix: "flow"}
	for _, stream := range []string{"demo:events:orders", "app:{orders}:events", "x", "a{b}c{d}"} {
		if got, want := HashSlot(k.StreamLease(stream, "shop")), HashSlot(stream); got != want {
			t.Errorf("StreamLease(%q) is in slot %d, the stream in %d", stream, got, want)
		}
		if got, want := HashSlot(k.StreamDedup(stream, "sink", "t", 3, "1-0")), HashSlot(stream); got != want {
			t.Errorf("StreamDedup(%q) is in slot %d, the stream in %d", stream, got, want)
		}
	}
	if got := k.SourceLease("gen"); got != "flow:source:{gen}:lease" {
		t.Errorf("SourceLease = %q", got)
	}
	if got := k.Members(); got != "flow:members" {
		t.Errorf("Members = %q", got)
	}
}
