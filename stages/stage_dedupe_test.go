package stages

import (
	"fmt"
	"testing"
)

// max_keys bounds the keys a dedupe stage remembers per partition: a third key's message is
// dead-lettered, saying why, while the two keys held go on (their duplicates found); once a key is
// forgotten, its place is free.
func TestDedupeMaxKeys(t *testing.T) {
	proc, st := statefulProcessor(t, `
stage "once" {
  kind       = "dedupe"
  input      = topic.in
  output     = topic.a
  key        = msg.id
  within     = "1h"
  event_time = msg.at
  max_keys   = 2
}
`+sinkA, "once")
	msg := func(id string, minutes int) string {
		return fmt.Sprintf(`{"id":%q,"at":%d}`, id, int64(minutes)*60000)
	}
	outs, errs := st.batch(t, proc, msg("a", 1), msg("b", 2), msg("c", 3), msg("a", 4), msg("b", 5))
	want := "partition 2 of stage once already holds max_keys = 2 keys"
	if errs[2] == nil || !IsPermanent(errs[2]) || errs[2].Error() != want {
		t.Fatalf("the third key: %v, want the permanent error %q", errs[2], want)
	}
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || errs[4] != nil || len(outs) != 2 {
		t.Fatalf("a and b pass once each, their copies are dropped: %v, %d outputs", errs, len(outs))
	}
	if n := st.keyCount(t); n != 2 {
		t.Fatalf("key count %d, want 2", n)
	}
	// a's hour is up at 61 minutes, b's at 62: a is forgotten, and c takes its place.
	outs, errs = st.batch(t, proc, msg("b", 61))
	if errs[0] != nil || len(outs) != 0 || st.keyCount(t) != 1 {
		t.Fatalf("b within its hour: %v, %d outputs, key count %d; want a duplicate, and a forgotten", errs, len(outs), st.keyCount(t))
	}
	outs, errs = st.batch(t, proc, msg("c", 61), msg("d", 61))
	if errs[0] != nil || len(outs) != 1 || errs[1] == nil {
		t.Fatalf("c takes a's place, d is the third key: %v, %d outputs", errs, len(outs))
	}
	if n := st.keyCount(t); n != 2 || len(st.values) != 3 {
		t.Fatalf("key count %d, state %q; want 2 keys and their count", n, st.values)
	}
}

// A key may not be one of the state entries that are flowrun's own.
func TestDedupeRefusesKeysThatBeginWithNUL(t *testing.T) {
	proc, st := statefulProcessor(t, dedupeByID, "once")
	_, errs := st.batch(t, proc, `{"id":"\u0000keys","at":1}`)
	if errs[0] == nil || !IsPermanent(errs[0]) {
		t.Fatalf("a key that begins with NUL: %v, want a permanent error", errs[0])
	}
}

// A dedupe's key is evaluated once per message (the runtime asks for it before Process does), and
// again once the message changed.
func TestDedupeKeyIsReadAgainOnceTheMessageChanged(t *testing.T) {
	proc, _ := statefulProcessor(t, dedupeByID, "once")
	d := proc.StatePrefetcher
	m := NewMessage("", []byte(`{"id":"a","at":1}`), nil)
	if keys := d.StateKeys(&m, nil); len(keys) != 2 || keys[0] != "a" {
		t.Fatalf("state keys %q, want a and the count", keys)
	}
	m.Value["id"] = "b"
	m.Changed()
	if keys := d.StateKeys(&m, nil); len(keys) != 2 || keys[0] != "b" {
		t.Fatalf("state keys %q once the message changed, want b and the count", keys)
	}
}

// dedupeByID is a dedupe stage "once" of the keys msg.id within an hour of msg.at.
const dedupeByID = `
stage "once" {
  kind   = "dedupe"
  input  = topic.in
  output = topic.a
  key    = msg.id
  within = "1h"
  event_time = msg.at
}
` + sinkA
