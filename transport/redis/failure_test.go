package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
)

// TestSurvivesRestartAndClientKill: the client's pool recovers from dropped connections and from
// a Redis restart; with AOF nothing acknowledged is lost, pending entries included.
func TestSurvivesRestartAndClientKill(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t, redistest.WithAOF())
	c := openURLs(t, srv.URL())
	k := testKeys(t)
	in := k.Stream("in", 0)
	b := readN(t, c, in, 10)
	if err := c.Ack(ctx, in, "stage", nil, b.IDs()[:4]...); err != nil {
		t.Fatal(err)
	}

	// CLIENT KILL drops every pooled connection. Commands fail at most once per dead
	// connection (no retries), and then work again.
	if err := srv.Client(t).Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	recovered := false
	for range 3 {
		if _, err := c.StreamStats(ctx, in); err == nil {
			recovered = true
			break
		}
	}
	if !recovered {
		t.Fatal("client did not recover after CLIENT KILL")
	}

	srv.Restart(t)
	waitFor(t, "the client to reconnect", func() bool { return c.Universal().Ping(ctx).Err() == nil })
	info, err := c.StreamStats(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if info.Length != 10 || len(info.Groups) != 1 || info.Groups[0].Pending != 6 {
		t.Fatalf("after restart: %+v", info)
	}
	// The 6 unacked entries are still there for the consumer to recover: exactly those.
	rb, err := c.ReadPending(ctx, ReadArgs{Stream: in, Group: "stage", Consumer: "w1"}, "")
	if err != nil || !slices.Equal(rb.IDs(), b.IDs()[4:]) {
		t.Fatalf("ReadPending after restart = %v, %v; want the unacked %v", rb.IDs(), err, b.IDs()[4:])
	}
	// Scripts are gone after a restart; the fenced commit still works.
	l, ok, err := c.AcquireLease(ctx, k.Lease("in", 0, "stage"), "w1", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	srv.Restart(t)
	waitFor(t, "the client to reconnect", func() bool { return c.Universal().Ping(ctx).Err() == nil })
	if _, err := c.Commit(ctx, CommitArgs{Outputs: outputsFor(k, rb), Stream: in, Group: "stage", IDs: rb.IDs(), Lease: &l}); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, c, in, "stage"); n != 0 {
		t.Fatalf("pending = %d", n)
	}
	// The commit wrote each recovered entry's output once, none lost or repeated by the restarts.
	written := map[string]int{}
	for p := range 4 {
		entries, err := c.Universal().XRange(ctx, k.Stream("out", p), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			written[fmt.Sprint(e.Values["payload"])]++
		}
	}
	for _, e := range rb.Entries {
		if written[string(e.Payload)] != 1 {
			t.Errorf("the output of %s (%s) was written %d times, want once", e.ID, e.Payload, written[string(e.Payload)])
		}
	}
	if len(written) != len(rb.Entries) {
		t.Errorf("%d distinct outputs, want the %d of the recovered entries: %v", len(written), len(rb.Entries), written)
	}
}

// TestBlockedReadHonoursDeadline: a blocking read returns when its context's deadline passes,
// not only when Block ends.
func TestBlockedReadHonoursDeadline(t *testing.T) {
	c := serverBackend().open(t)
	k := testKeys(t)
	s := k.Stream("in", 0)
	if err := c.EnsureGroup(ctxT(t), s, "g"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "w", Block: time.Minute})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("read returned no error after its deadline")
		}
		var te interface{ Timeout() bool }
		if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &te) && te.Timeout()) {
			t.Fatalf("err = %v, want a timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a read blocked for a minute ignored its context deadline")
	}
	// The pool is still usable.
	if err := c.Universal().Ping(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
}
