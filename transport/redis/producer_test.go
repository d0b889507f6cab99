package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
)

type numbered struct {
	N int `json:"n"`
}

func TestProducerManyPartitions(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		const parts, total, writers = 8, 10000, 4
		p, err := c.NewProducer(ProducerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < total; i += writers {
					key := fmt.Sprintf("cust-%d", i%97)
					e := Entry{Key: key, Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
					if err := p.Add(ctx, k.Stream("orders", Partition(key, parts)), e); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		seen := make([]int, total)
		for part := range parts {
			msgs, err := c.Universal().XRange(ctx, k.Stream("orders", part), "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			last := map[string]int{} // per key and writer, entries keep the order they were added in
			for _, m := range msgs {
				e, err := DecodeEntry(m)
				if err != nil {
					t.Fatal(err)
				}
				if Partition(e.Key, parts) != part {
					t.Fatalf("key %s in partition %d", e.Key, part)
				}
				var v numbered
				if err := json.Unmarshal(e.Payload, &v); err != nil {
					t.Fatal(err)
				}
				seen[v.N]++
				lane := fmt.Sprintf("%s/%d", e.Key, v.N%writers)
				if prev, ok := last[lane]; ok && prev > v.N {
					t.Fatalf("lane %s: %d after %d", lane, v.N, prev)
				}
				last[lane] = v.N
			}
		}
		for n, times := range seen {
			if times != 1 {
				t.Fatalf("entry %d arrived %d times", n, times)
			}
		}
	})
}

func TestProducerBackpressure(t *testing.T) {
	srv := redistest.Start(t) // CLIENT PAUSE must not disturb other tests
	c := openURLs(t, srv.URL())
	k := testKeys(t)
	ctx := ctxT(t)
	p, err := c.NewProducer(ProducerOptions{BatchSize: 4, Lanes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	// The flusher blocks on a paused write; the buffer (2*BatchSize) then fills and Add blocks
	// until ctx ends.
	added := 0
	for {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := p.Add(short, k.Stream("bp", 0), Entry{Payload: []byte(`1`)})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		added++
		if added > 100 {
			t.Fatal("Add never blocked")
		}
	}
	if added < 8 || added > 4+8 {
		t.Fatalf("Add blocked after %d entries, want between the buffer (8) and buffer+batch (12)", added)
	}
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Universal().XLen(ctx, k.Stream("bp", 0)).Result(); n != int64(added) {
		t.Fatalf("XLEN = %d, want %d", n, added)
	}
}

func TestProducerCloseReleasesBlockedAdd(t *testing.T) {
	srv := redistest.Start(t)
	c := openURLs(t, srv.URL())
	k := testKeys(t)
	ctx := ctxT(t)
	p, err := c.NewProducer(ProducerOptions{BatchSize: 2, Lanes: 1})
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	// Fill the producer until an Add blocks, in the background.
	blocked := make(chan error, 1)
	go func() {
		for {
			if err := p.Add(ctx, k.Stream("c", 0), Entry{Payload: []byte(`1`)}); err != nil {
				blocked <- err
				return
			}
		}
	}()
	lane := p.lanes[0]
	waitFor(t, "the buffer to fill", func() bool { return len(lane.in) == cap(lane.in) })
	// Close cannot finish while Redis refuses writes: it gives up at its deadline, but the
	// blocked Add is released at once.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := p.Close(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want the deadline", err)
	}
	if err := <-blocked; !errors.Is(err, ErrProducerClosed) {
		t.Fatalf("blocked Add = %v, want ErrProducerClosed", err)
	}
	if err := p.Close(ctx); !errors.Is(err, ErrProducerClosed) {
		t.Fatalf("second Close = %v", err)
	}
	// Once Redis accepts writes again the producer writes everything buffered and exits (goleak
	// checks the goroutine is gone).
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	<-lane.done
	if lane.closeErr != nil {
		t.Fatal(lane.closeErr)
	}
	if n := xlen(t, c, k.Stream("c", 0)); n < int64(cap(lane.in)) {
		t.Fatalf("XLEN = %d, want at least the %d buffered entries", n, cap(lane.in))
	}
}

func TestProducerReportsErrorsOnFlush(t *testing.T) {
	forEach(t, []backend{serverBackend(), miniredisBackend()}, func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		wrong := k.Stream("wrongtype", 0)
		if err := c.Universal().Set(ctx, wrong, "not a stream", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		p, err := c.NewProducer(ProducerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ok := k.Stream("fine", 0)
		_ = p.Add(ctx, ok, Entry{Payload: []byte(`1`)})
		_ = p.Add(ctx, wrong, Entry{Payload: []byte(`2`)})
		_ = p.Add(ctx, ok, Entry{Payload: []byte(`3`)})
		err = p.Flush(ctx)
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), wrong) {
			t.Fatalf("Flush = %v, want the WRONGTYPE error naming %s", err, wrong)
		}
		if n, _ := c.Universal().XLen(ctx, ok).Result(); n != 2 {
			t.Fatalf("the good entries were not written: XLEN = %d", n)
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatalf("second Flush = %v, want nil (errors are reported once)", err)
		}
		if err := p.Add(ctx, ok, Entry{}); err == nil {
			t.Fatal("Add accepted an empty payload")
		}
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Add(ctx, ok, Entry{Payload: []byte(`1`)}); !errors.Is(err, ErrProducerClosed) {
			t.Fatalf("Add after Close = %v", err)
		}
		if err := p.Flush(ctx); !errors.Is(err, ErrProducerClosed) {
			t.Fatalf("Flush after Close = %v", err)
		}
	})
}

// TestAppend writes a batch at once: in order per stream, capped by MaxLen, failures counted and
// the rest written; effectively-once outputs and bad entries are refused before anything is written.
func TestAppend(t *testing.T) {
	forEach(t, allBackends(), func(t *testing.T, c *Client, k Keys) {
		ctx := ctxT(t)
		a, b, wrong := k.Stream("a", 0), k.Stream("b", 0), k.Stream("wrongtype", 0)
		var outs []Output
		for i := range 300 {
			outs = append(outs, Output{Stream: a, Entry: Entry{Payload: fmt.Appendf(nil, `{"n":%d}`, i)}})
			outs = append(outs, Output{Stream: b, Entry: Entry{Payload: fmt.Appendf(nil, `{"n":%d}`, i)}, MaxLen: 10})
		}
		if err := c.Append(ctx, outs); err != nil {
			t.Fatal(err)
		}
		msgs, err := c.Universal().XRange(ctx, a, "-", "+").Result()
		if err != nil || len(msgs) != 300 {
			t.Fatalf("%s holds %d entries (%v), want 300", a, len(msgs), err)
		}
		for i, m := range msgs {
			if want := fmt.Sprintf(`{"n":%d}`, i); m.Values[FieldPayload] != want {
				t.Fatalf("entry %d of %s is %v, want %s", i, a, m.Values[FieldPayload], want)
			}
		}
		if n := xlen(t, c, b); n >= 300 {
			t.Errorf("%s holds %d entries: MaxLen 10 was not applied", b, n)
		}

		// A bad entry or an effectively-once output: nothing is written.
		for _, bad := range []Output{{Stream: a, Entry: Entry{}}, {Stream: a, Entry: Entry{Payload: []byte(`1`)}, DedupKey: "d"}} {
			if err := c.Append(ctx, []Output{{Stream: a, Entry: Entry{Payload: []byte(`1`)}}, bad}); err == nil {
				t.Errorf("Append accepted %+v", bad)
			}
		}
		if n := xlen(t, c, a); n != 300 {
			t.Errorf("%s holds %d entries after refused batches, want 300", a, n)
		}

		if err := c.Universal().Set(ctx, wrong, "not a stream", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		err = c.Append(ctx, []Output{{Stream: wrong, Entry: Entry{Payload: []byte(`1`)}}, {Stream: a, Entry: Entry{Payload: []byte(`2`)}}})
		if err == nil || !strings.Contains(err.Error(), "1 of 2") || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("Append = %v, want 1 of 2 not written, WRONGTYPE", err)
		}
		if n := xlen(t, c, a); n != 301 {
			t.Errorf("the good entry was not written: %s holds %d", a, n)
		}
	})
}

func TestProducerLingerFlushesPartialBatch(t *testing.T) {
	c := serverBackend().open(t)
	k := testKeys(t)
	ctx := ctxT(t)
	p, err := c.NewProducer(ProducerOptions{BatchSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if err := p.Add(ctx, k.Stream("l", 0), Entry{Payload: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	// No Flush: the linger timer writes the lone entry.
	waitFor(t, "the linger flush", func() bool {
		n, _ := c.Universal().XLen(ctx, k.Stream("l", 0)).Result()
		return n == 1
	})
}

func TestProducerOptions(t *testing.T) {
	c := miniredisBackend().open(t)
	for _, o := range []ProducerOptions{{BatchSize: -1}, {Linger: 2 * time.Millisecond}, {Linger: -1}, {Lanes: -1}} {
		if _, err := c.NewProducer(o); err == nil {
			t.Errorf("NewProducer(%+v) accepted", o)
		}
	}
}

func BenchmarkProducer(b *testing.B) {
	c, err := Open(context.Background(), Options{URLs: []string{redistest.Shared(b).URL()}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	p, _ := c.NewProducer(ProducerOptions{})
	stream := "bench:{producer:0}"
	payload := []byte(`{"customer_id":"c-42","amount":99.5,"country":"de"}`)
	for b.Loop() {
		if err := p.Add(ctx, stream, Entry{Key: "c-42", Payload: payload}); err != nil {
			b.Fatal(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		b.Fatal(err)
	}
	c.Universal().Del(ctx, stream)
}
