package redis

import (
	"slices"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// The record of a stateful stage's partition count reads back as written, and StateHeld finds the
// partitions that hold keys of the kind or timers, not those whose state hash holds only flowrun's
// own fields, or nothing.
func TestStatePartitionsAndHeldState(t *testing.T) {
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

		hashes := []string{k.State("in", 0, "count"), k.State("in", 1, "count"), k.State("in", 2, "count"), k.State("in", 3, "count"), k.State("in", 4, "count")}
		timers := []string{k.Timers("in", 0, "count"), k.Timers("in", 1, "count"), k.Timers("in", 2, "count"), k.Timers("in", 3, "count"), k.Timers("in", 4, "count")}
		u := c.Universal()
		// 0: keys of the kind besides flowrun's own fields; 1: only flowrun's own fields (a drained
		// aggregate's: its watermark, idle mark and count of keys, 0); 2: a timer alone; 3: nothing;
		// 4: a record of keys (a dedupe's, whose timers fired) beside flowrun's own fields.
		if err := u.HSet(ctx, hashes[0], WatermarkField, "1000", "\x00keys", "1", "a", "1").Err(); err != nil {
			t.Fatal(err)
		}
		if err := u.HSet(ctx, hashes[1], WatermarkField, "1000", "\x00idle", "1", "\x00keys", "0").Err(); err != nil {
			t.Fatal(err)
		}
		if err := u.ZAdd(ctx, timers[2], goredis.Z{Score: 60_000, Member: "close:a"}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := u.HSet(ctx, hashes[4], WatermarkField, "1000", "\x00keys", "1", PackedKeysField+"7", "+\x01a\x011").Err(); err != nil {
			t.Fatal(err)
		}
		held, err := c.StateHeld(ctx, hashes, timers)
		if err != nil {
			t.Fatal(err)
		}
		if want := []bool{true, false, true, false, true}; !slices.Equal(held, want) {
			t.Errorf("StateHeld = %v, want %v", held, want)
		}
	})
}
