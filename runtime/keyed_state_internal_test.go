package runtime

import (
	"context"
	"testing"

	"github.com/flowrun/flowrun/internal/embedded"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// keyOfMessage names each message's key as the state key it reads.
type keyOfMessage struct{}

func (keyOfMessage) StateKeys(m *stages.Message, keys []string) []string { return append(keys, m.Key) }

// TestPrefetchReadsABatchsKeysAtOnce: the state a batch's messages read comes from one read ahead
// (one command however many keys), found and missing keys alike, with the batch's own writes over it.
func TestPrefetchReadsABatchsKeysAtOnce(t *testing.T) {
	srv, err := embedded.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	c, err := redis.Open(ctx, redis.Options{URLs: []string{srv.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Universal().HSet(ctx, "state", "a", "1", "b", "2").Err(); err != nil {
		t.Fatal(err)
	}
	b := &batchState{rdb: c, hash: "state"}
	var msgs []*message
	for _, k := range []string{"a", "b", "c", "a"} {
		msgs = append(msgs, &message{msg: stages.Message{Key: k}})
	}
	before := srv.CommandCount()
	b.prefetch(ctx, keyOfMessage{}, msgs)
	read := func(key string) (string, bool) {
		var v []byte
		var found bool
		if _, _, err := withAttemptState(ctx, b, func(ctx context.Context) ([]stages.Output, error) {
			var err error
			v, found, err = stateHandle{}.Get(ctx, key)
			return nil, err
		}); err != nil {
			t.Fatal(err)
		}
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
	if _, _, err := withAttemptState(ctx, b, func(ctx context.Context) ([]stages.Output, error) {
		return nil, stateHandle{}.Put(ctx, "a", []byte("3"))
	}); err != nil {
		t.Fatal(err)
	}
	if v, _ := read("a"); v != "3" {
		t.Errorf("after the batch's own write, Get(a) = %q, want 3", v)
	}
}

// TestStateRefusesTheRuntimesFields: a kind, or a Go function, cannot write or delete a field of the
// state hash that is the runtime's (the watermark's, the idle marker's); its message fails for good.
// The kinds' own entries that begin with a NUL byte (stages.KeyCountKey) are theirs to write.
func TestStateRefusesTheRuntimesFields(t *testing.T) {
	a := &attemptState{batch: &batchState{}}
	ctx := context.WithValue(context.Background(), attemptStateKey{}, a)
	var s stages.State = stateHandle{}
	for _, field := range []string{redis.WatermarkField, redis.IdleField} {
		if err := s.Put(ctx, field, []byte("0")); !stages.IsPermanent(err) {
			t.Errorf("Put of the runtime's field %q: %v", field, err)
		}
		if err := s.Delete(ctx, field); !stages.IsPermanent(err) {
			t.Errorf("Delete of the runtime's field %q: %v", field, err)
		}
	}
	if len(a.set)+len(a.del) != 0 {
		t.Errorf("the attempt wrote %v and deleted %v", a.set, a.del)
	}
	for _, key := range []string{"watermark", stages.KeyCountKey} {
		if err := s.Put(ctx, key, []byte("0")); err != nil || string(a.set[key]) != "0" {
			t.Errorf("Put of a key of the kind's own, %q: %v, %v", key, err, a.set)
		}
	}
}
