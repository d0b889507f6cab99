package redis

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// The record of a stateful stage's partition count reads back as written, and StateSizes counts the
// kind's keys and timers of each partition, not the runtime's fields: partitions whose state holds
// nothing but a watermark and an idle mark, or no state at all, count none.
func TestStatePartitionsAndSizes(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		record := k.StatePartitions("in", "count")
		if _, found, err := c.RecordedPartitions(ctx, record); err != nil || found {
			t.Fatalf("a record before any: %v, %v", found, err)
		}
		if err := c.RecordPartitions(ctx, record, 3); err != nil {
			t.Fatal(err)
		}
		if n, found, err := c.RecordedPartitions(ctx, record); err != nil || !found || n != 3 {
			t.Fatalf("the record: %d, %v, %v; want 3", n, found, err)
		}

		hashes := []string{k.State("in", 0, "count"), k.State("in", 1, "count"), k.State("in", 2, "count")}
		timers := []string{k.Timers("in", 0, "count"), k.Timers("in", 1, "count"), k.Timers("in", 2, "count")}
		u := c.Universal()
		if err := u.HSet(ctx, hashes[0], WatermarkField, "1000", IdleField, "1", "a", "1", "b", "2").Err(); err != nil {
			t.Fatal(err)
		}
		if err := u.ZAdd(ctx, timers[0], goredis.Z{Score: 60_000, Member: "close:a"}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := u.HSet(ctx, hashes[1], WatermarkField, "1000", IdleField, "1").Err(); err != nil {
			t.Fatal(err)
		}
		keys, timerCounts, err := c.StateSizes(ctx, hashes, timers)
		if err != nil {
			t.Fatal(err)
		}
		for p, want := range [][2]int64{{2, 1}, {0, 0}, {0, 0}} {
			if keys[p] != want[0] || timerCounts[p] != want[1] {
				t.Errorf("partition %d: %d keys and %d timers, want %d and %d", p, keys[p], timerCounts[p], want[0], want[1])
			}
		}
	})
}
