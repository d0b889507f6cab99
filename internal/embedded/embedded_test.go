package embedded

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	redis "github.com/flowrun/flowrun/transport/redis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T) (*Server, *redis.Client) {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := redis.Open(ctx, redis.Options{URLs: []string{s.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return s, c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestProduceAndReadRoundTrip(t *testing.T) {
	s, c := start(t)
	if c.IsCluster() {
		t.Fatal("the embedded server was opened as a cluster")
	}
	if want := "redis://" + s.Addr(); s.URL() != want {
		t.Fatalf("URL = %q, want %q", s.URL(), want)
	}
	ctx := ctxT(t)
	k := redis.Keys{Prefix: "emb"}
	stream := k.Stream("orders", 0)
	if err := c.EnsureGroup(ctx, stream, redis.Group("enrich")); err != nil {
		t.Fatal(err)
	}
	p, err := c.NewProducer(redis.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, payload := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
		if err := p.Add(ctx, stream, redis.Entry{Key: "k", Payload: []byte(payload), Headers: map[string]string{"i": string(rune('a' + i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := c.ReadGroup(ctx, redis.ReadArgs{Stream: stream, Group: "enrich", Consumer: "w", Block: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Entries) != 3 || len(b.Malformed) != 0 {
		t.Fatalf("read %+v", b)
	}
	for i, e := range b.Entries {
		if want := `{"n":` + string(rune('1'+i)) + `}`; string(e.Payload) != want || e.Key != "k" || e.Headers["i"] != string(rune('a'+i)) {
			t.Fatalf("entry %d = %+v, want payload %s", i, e, want)
		}
	}
	if err := c.Ack(ctx, stream, "enrich", nil, b.IDs()...); err != nil {
		t.Fatal(err)
	}
	info, err := c.StreamStats(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if info.Length != 3 || len(info.Groups) != 1 || info.Groups[0].Pending != 0 || info.Groups[0].Lag != 0 {
		t.Fatalf("stats = %+v", info)
	}
}

// A lease must expire by the wall clock on its own, or a crashed owner's partitions would never
// move to another process.
func TestLeasesExpireByTheWallClock(t *testing.T) {
	_, c := start(t)
	ctx := ctxT(t)
	key := redis.Keys{Prefix: "emb"}.Lease("orders", 0, "enrich")
	if _, ok, err := c.AcquireLease(ctx, key, "a", 5*time.Millisecond); err != nil || !ok {
		t.Fatalf("acquire: ok=%v, %v", ok, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ok, err := c.AcquireLease(ctx, key, "b", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease never expired")
		}
		time.Sleep(time.Millisecond) // poll: the condition is the wall clock passing the TTL
	}
	holder, _, ok, err := c.LeaseHolder(ctx, key)
	if err != nil || !ok || holder.Owner != "b" {
		t.Fatalf("holder = %+v, %v, %v", holder, ok, err)
	}
}

func TestCloseDropsEverything(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close() // a second Close is harmless
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := redis.Open(ctx, redis.Options{URLs: []string{s.URL()}}); err == nil {
		_ = c.Close()
		t.Fatal("connected to a closed embedded server")
	}
}
