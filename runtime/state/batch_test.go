package state

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/embedded"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

func open(t *testing.T) (*embedded.Server, *redis.Client) {
	t.Helper()
	srv, err := embedded.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	c, err := redis.Open(context.Background(), redis.Options{URLs: []string{srv.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// TestPrefetchReadsABatchsKeysAtOnce: the state a batch's messages read comes from one read ahead
// (one command however many keys), found and missing keys alike, with the batch's own writes over it.
func TestPrefetchReadsABatchsKeysAtOnce(t *testing.T) {
	srv, c := open(t)
	ctx := context.Background()
	if err := c.Universal().HSet(ctx, "state", "a", "1", "b", "2").Err(); err != nil {
		t.Fatal(err)
	}
	b := NewBatch(c, Keys{Hash: "state"}, 0, nil, nil)
	before := srv.CommandCount()
	b.Prefetch(ctx, []string{"a", "b", "c", "a"})
	read := func(key string) (string, bool) {
		a := b.Attempt(0)
		v, found, err := a.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		a.Join()
		return string(v), found
	}
	for key, want := range map[string]string{"a": "1", "b": "2", "c": ""} {
		if v, found := read(key); v != want || found != (want != "") {
			t.Errorf("Get(%q) = %q, %v; want %q", key, v, found, want)
		}
	}
	if n := srv.CommandCount() - before; n != 1 {
		t.Errorf("%d commands for the batch's reads, want 1", n)
	}
	a := b.Attempt(0)
	if err := a.Put(ctx, "a", []byte("3")); err != nil {
		t.Fatal(err)
	}
	a.Join()
	if v, _ := read("a"); v != "3" {
		t.Errorf("after the batch's own write, Get(a) = %q, want 3", v)
	}
}

// TestStateRefusesTheRuntimesFields: a kind, or a Go function, cannot write or delete the field of
// the state hash that is the runtime's (the watermark's); its message fails for good. The kinds'
// own entries that begin with a NUL byte (stages.KeyCountKey) are theirs to write.
func TestStateRefusesTheRuntimesFields(t *testing.T) {
	ctx := context.Background()
	a := NewBatch(nil, Keys{}, 0, nil, nil).Attempt(0)
	if err := a.Put(ctx, redis.WatermarkField, []byte("0")); !stages.IsPermanent(err) {
		t.Errorf("Put of the runtime's field: %v", err)
	}
	if err := a.Delete(ctx, redis.WatermarkField); !stages.IsPermanent(err) {
		t.Errorf("Delete of the runtime's field: %v", err)
	}
	if len(a.set)+len(a.del) != 0 {
		t.Errorf("the attempt wrote %v and deleted %v", a.set, a.del)
	}
	for _, key := range []string{"watermark", stages.KeyCountKey} {
		if err := a.Put(ctx, key, []byte("0")); err != nil || string(a.set[key]) != "0" {
			t.Errorf("Put of a key of the kind's own, %q: %v, %v", key, err, a.set)
		}
	}
}

// TestDueTimersPageOnPastFired: the timers a batch has fired stay in Redis until it commits, and
// are the earliest due; the next page is the next timers, not an empty page that would leave the
// rest unfired.
func TestDueTimersPageOnPastFired(t *testing.T) {
	_, c := open(t)
	ctx := context.Background()
	for i, name := range []string{"a", "b", "c", "d", "e"} {
		if err := c.Universal().ZAdd(ctx, "timers", goredis.Z{Score: float64(10 + i), Member: name}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b := NewBatch(c, Keys{Hash: "state", Timers: "timers"}, 0, nil, nil)
	fired := map[string]bool{}
	var order []string
	for page := 0; page < 10; page++ {
		due, err := b.DueTimers(ctx, 100, 2, fired)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) == 0 {
			break
		}
		if len(due) > 2 {
			t.Fatalf("page %d has %d timers, want at most 2", page, len(due))
		}
		for _, d := range due {
			fired[d.Name] = true
			order = append(order, d.Name)
			a := b.Attempt(100)
			if err := a.CancelTimer(ctx, d.Name); err != nil {
				t.Fatal(err)
			}
			a.Join()
		}
	}
	if got := strings.Join(order, ""); got != "abcde" {
		t.Errorf("fired %q, want every timer once, earliest first: abcde", got)
	}
}

// TestAnAttemptReusedStartsEmpty: the batch's next attempt reuses a finished one's maps, and sees
// only the batch's writes, none of the finished attempt's own, nor its outcomes.
func TestAnAttemptReusedStartsEmpty(t *testing.T) {
	ctx := context.Background()
	b := NewBatch(nil, Keys{}, 0, nil, nil)
	a := b.Attempt(0)
	if err := a.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	_ = a.SetTimer(ctx, "t", time.UnixMilli(5))
	a.Record(stages.Duplicate)
	a.Join()
	failed := b.Attempt(0)
	if err := failed.Put(ctx, "b", []byte("2")); err != nil {
		t.Fatal(err)
	}
	failed.Record(stages.Late)
	failed.Failed() // for good: its outcome counts, its writes do not
	next := b.Attempt(7)
	if next.Recorded() || len(next.set)+len(next.timerAt) != 0 || next.watermark != 7 {
		t.Fatalf("the next attempt starts with writes %v, timers %v, outcomes recorded %v, watermark %d",
			next.set, next.timerAt, next.Recorded(), next.watermark)
	}
	if v, found, err := next.Get(ctx, "a"); err != nil || !found || string(v) != "1" {
		t.Errorf("Get(a) = %q, %v, %v; want the batch's 1", v, found, err)
	}
	w := b.Writes()
	if late, dups := b.Outcomes(); late != 1 || dups != 1 || len(w.Set) != 1 || w.Timers["t"] != 5 {
		t.Errorf("the batch has %d late, %d duplicates, writes %v, timers %v; want 1, 1, a only, t at 5", late, dups, w.Set, w.Timers)
	}
}

// TestTimerMembersShareATimer: the members that a batch's attempts add with the same prefix and
// time share one timer, named by them; a member alone has the name SetTimer would give its own
// timer, unless the batch has it alone at two times (it then has a timer at each, not one that
// the last to be named would move); a failed attempt's members are dropped with its writes; the
// batch's due timers and its writes see them all.
func TestTimerMembersShareATimer(t *testing.T) {
	_, c := open(t)
	ctx := context.Background()
	b := NewBatch(c, Keys{Hash: "state", Timers: "timers", Holds: "holds"}, 0, nil, nil)
	add := func(join bool, adds ...any) {
		a := b.Attempt(0)
		for i := 0; i < len(adds); i += 2 {
			if err := a.AddTimerMember(ctx, "key:", time.UnixMilli(int64(adds[i].(int))), adds[i+1].(string)); err != nil {
				t.Fatal(err)
			}
		}
		if join {
			a.Join()
		} else {
			a.Failed()
		}
	}
	add(true, 100, "b", 100, "a")
	add(true, 100, "c", 100, "a")
	add(false, 100, "d", 300, "e") // failed: neither d nor e has a timer
	add(true, 200, "x")
	add(true, 300, "y", 400, "y") // y alone at two times
	want := map[string]int64{
		stages.TimerGroupName("key:", 100, []string{"a", "b", "c"}): 100,
		"key:x": 200,
		stages.TimerGroupName("key:", 300, []string{"y"}): 300,
		stages.TimerGroupName("key:", 400, []string{"y"}): 400,
	}
	due, err := b.DueTimers(ctx, 250, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 2 || due[0].At != 100 || due[1] != (redis.DueTimer{Name: "key:x", At: 200}) {
		t.Fatalf("due at 250: %+v, want the group of a, b and c at 100 and x's at 200", due)
	}
	w := b.Writes()
	if len(w.Timers) != len(want) {
		t.Fatalf("timers %q, want %q", w.Timers, want)
	}
	for name, at := range want {
		if w.Timers[name] != at {
			t.Errorf("timer %q at %d, want %d (timers %q)", name, w.Timers[name], at, w.Timers)
		}
		members, ok := stages.TimerMembers("key:", name, nil)
		if !ok || len(members) == 0 {
			t.Errorf("timer %q: members %q, %v", name, members, ok)
		}
	}
}

// TestPutCopiesSmallValuesTogether: the small values an attempt puts are copied many to an
// allocation (a dedupe puts two a message), and each copy stays as it was put: neither the
// caller's later change to its value nor an append to another copy reaches it.
func TestPutCopiesSmallValuesTogether(t *testing.T) {
	ctx := context.Background()
	b := NewBatch(storeOfNothing{}, Keys{Hash: "h"}, 0, nil, nil)
	a := b.Attempt(0)
	value := []byte("1764478823000")
	if n := testing.AllocsPerRun(100, func() { _ = a.Put(ctx, "k", value) }); n >= 1 {
		t.Errorf("%v allocations a Put of a small value, want fewer than one", n)
	}
	_ = a.Put(ctx, "a", value)
	_ = a.Put(ctx, "b", []byte("2"))
	copy(value, "9999999999999")
	got, _, _ := a.Get(ctx, "a")
	_ = append(got, "xyz"...)
	a.Join()
	a = b.Attempt(0)
	_ = a.Put(ctx, "c", []byte("3")) // the reused attempt's copies go after the batch's
	for key, want := range map[string]string{"a": "1764478823000", "b": "2", "c": "3"} {
		if v, _, _ := a.Get(ctx, key); string(v) != want {
			t.Errorf("Get(%q) = %q, want %q", key, v, want)
		}
	}
	_ = a.Put(ctx, "e", []byte{})
	if v, found, _ := a.Get(ctx, "e"); v != nil || !found {
		t.Errorf("an empty value put reads as %q, %v; want nil, true, as it always did", v, found)
	}
}

// TestABatchOverACommitReadsTheSameEitherWay: a batch processed while the batch before it commits
// (Over) reads that batch's keys, timers and holds as it left them, whether Redis holds its commit
// yet or not; its own writes come over both.
func TestABatchOverACommitReadsTheSameEitherWay(t *testing.T) {
	for _, applied := range []bool{false, true} {
		t.Run(map[bool]string{false: "before the commit", true: "after the commit"}[applied], func(t *testing.T) {
			_, c := open(t)
			ctx := context.Background()
			rdb := c.Universal()
			keys := Keys{Hash: "state", Timers: "timers", Holds: "holds"}
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(rdb.HSet(ctx, "state", "a", "1", "b", "2").Err())
			must(rdb.ZAdd(ctx, "timers", goredis.Z{Score: 10, Member: "t1"}, goredis.Z{Score: 20, Member: "t2"},
				goredis.Z{Score: 30, Member: "t3"}).Err())
			must(rdb.ZAdd(ctx, "holds", goredis.Z{Score: 5, Member: "h1"}, goredis.Z{Score: 15, Member: "h2"}).Err())

			before := NewBatch(c, keys, 0, nil, nil)
			a := before.Attempt(0)
			must(a.Put(ctx, "a", []byte("10")))
			must(a.Delete(ctx, "b"))
			must(a.Put(ctx, "c", []byte("3")))
			must(a.SetTimer(ctx, "t4", time.UnixMilli(12)))
			must(a.CancelTimer(ctx, "t1"))
			must(a.SetTimer(ctx, "t2", time.UnixMilli(40)))
			must(a.Release(ctx, "h1"))
			must(a.Hold(ctx, "h3", time.UnixMilli(8)))
			a.Join()
			w := before.Writes()
			if applied { // what the commit writes, as it writes it
				for k, v := range w.Set {
					must(rdb.HSet(ctx, "state", k, v).Err())
				}
				must(rdb.HDel(ctx, "state", w.Delete...).Err())
				for name, at := range w.Timers {
					must(rdb.ZAdd(ctx, "timers", goredis.Z{Score: float64(at), Member: name}).Err())
				}
				must(rdb.ZRem(ctx, "timers", "t1").Err())
				for name, at := range w.Holds {
					must(rdb.ZAdd(ctx, "holds", goredis.Z{Score: float64(at), Member: name}).Err())
				}
				must(rdb.ZRem(ctx, "holds", "h1").Err())
			}

			b := NewBatch(c, keys, 0, nil, nil)
			b.Over(before)
			b.Prefetch(ctx, []string{"a", "b", "c", "d"})
			get := func(key string) string {
				t.Helper()
				a := b.Attempt(0)
				v, found, err := a.Get(ctx, key)
				must(err)
				a.Join()
				if !found {
					return "-"
				}
				return string(v)
			}
			for key, want := range map[string]string{"a": "10", "b": "-", "c": "3", "d": "-"} {
				if got := get(key); got != want {
					t.Errorf("Get(%q) = %s, want %s", key, got, want)
				}
			}
			due := func() string {
				t.Helper()
				timers, err := b.DueTimers(ctx, 35, 10, nil)
				must(err)
				var names []string
				for _, tm := range timers {
					names = append(names, tm.Name)
				}
				return strings.Join(names, ",")
			}
			if got := due(); got != "t4,t3" {
				t.Errorf("due timers %s, want t4,t3", got)
			}
			if at, found, err := b.MinHold(ctx); err != nil || !found || at != 8 {
				t.Errorf("MinHold = %d, %v, %v; want 8 (h3)", at, found, err)
			}

			// The batch's own writes come over the batch before's.
			a = b.Attempt(0)
			must(a.CancelTimer(ctx, "t4"))
			must(a.SetTimer(ctx, "t2", time.UnixMilli(25)))
			must(a.Release(ctx, "h3"))
			must(a.Put(ctx, "b", []byte("4")))
			a.Join()
			if got := due(); got != "t2,t3" {
				t.Errorf("due timers after the batch's own changes %s, want t2,t3", got)
			}
			if at, found, err := b.MinHold(ctx); err != nil || !found || at != 15 {
				t.Errorf("MinHold after the batch's own release = %d, %v, %v; want 15 (h2)", at, found, err)
			}
			if got := get("b"); got != "4" {
				t.Errorf("Get(b) after the batch's own write = %s, want 4", got)
			}
			if w := b.Writes(); len(w.Set) != 1 || string(w.Set["b"]) != "4" {
				t.Errorf("the batch writes %v; want its own write only", w.Set)
			}
		})
	}
}
