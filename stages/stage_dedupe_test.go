package stages

import (
	"context"
	"fmt"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/flowrun/flowrun/transport/jsonscan"
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

// A dedupe reads its key and event time from an entry's payload as it arrived, when they are a
// string and a string or whole number: it decodes nothing of the message, which it passes on as it
// came.
func TestDedupeDecodesNothingOfAPlainEntry(t *testing.T) {
	proc, st := statefulProcessor(t, dedupeByID, "once")
	m := NewEntryMessage("", []byte(`{"id":"a","pad":"xxxx","at":60000}`), nil)
	keys := proc.StatePrefetcher.StateKeys(&m, nil)
	at, err := EventTime(proc.Processor.(*dedupeStage).eventTime, &m)
	if err != nil || len(keys) != 2 || keys[0] != "a" || at.UnixMilli() != 60000 {
		t.Fatalf("key %q, event time %v, %v; want a, at 60000 ms", keys, at, err)
	}
	outs, err := proc.Processor.Process(context.Background(), st, &m, nil)
	if err != nil || len(outs) != 1 {
		t.Fatalf("Process: %d outputs, %v; want the message passed on", len(outs), err)
	}
	if m.Value != nil {
		t.Errorf("the message was decoded: %v", m.Value)
	}
}

// FuzzDedupeScannedAsDecoded: the key and event time that a dedupe reads from an entry's payload
// as it arrived (scannedStateKey, scannedEventTime) are those the expressions make of the payload
// decoded, errors alike, whatever the payload holds.
func FuzzDedupeScannedAsDecoded(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","at":60000}`,
		` { "at" : 1764478823000 , "id" : "k1" } `,
		`{"id":"a","id":"b","at":1,"at":2}`,                    // the last of a repeated name
		`{"i\u0064":"a","id":"b","at":1}`,                      // a name with escapes
		`{"id":"a\"b\\c\u00e9","at":"2026-01-02T15:04:05.5Z"}`, // a key with escapes
		`{"id":"","at":"not a time"}`,
		`{"id":"a","at":"2026-01-02T15:04:05+01:00"}`,
		`{"id":"a","at":"2026-13-02T15:04:05Z"}`,
		`{"id":"a","at":"2026-01-02T15:04:05\u005a"}`,
		`{"id":12,"at":1.5}`,
		`{"id":-0,"at":-12}`,
		`{"id":true,"at":1e3}`,
		`{"id":null,"at":null}`,
		`{"id":{"x":"}"},"at":[1]}`,
		`{"id":"a","at":1234567890123456}`,
		`{"id":"a","at":123456789012345}`,
		`{"at":5}`,
		`{"id":"a"}`,
		`{}`,
		`{"id":"\u0000keys","at":1}`,
		`null`,
		`[{"id":"a"}]`,
		`"id"`,
	} {
		f.Add([]byte(s))
	}
	proc, _ := statefulProcessor(f, dedupeByID, "once")
	d := proc.Processor.(*dedupeStage)
	f.Fuzz(func(t *testing.T, p []byte) {
		if jsonscan.Check(p) != nil || !gjson.ValidBytes(p) {
			return // reading an entry refuses it
		}
		scanned, decoded := NewEntryMessage("", p, nil), NewMessage("", p, nil)
		key, keyErr := scannedStateKey(d.key, d.eventTime, d.reads, &scanned)
		wantKey, wantKeyErr := stateKey(d.key, d.reads, &decoded)
		if key != wantKey || fmt.Sprint(keyErr) != fmt.Sprint(wantKeyErr) {
			t.Fatalf("%s: key %q, %v; decoded %q, %v", p, key, keyErr, wantKey, wantKeyErr)
		}
		at, atErr := EventTime(d.eventTime, &scanned)
		wantAt, wantAtErr := EventTime(d.eventTime, &decoded)
		if !at.Equal(wantAt) || fmt.Sprint(atErr) != fmt.Sprint(wantAtErr) {
			t.Fatalf("%s: event time %v, %v; decoded %v, %v", p, at, atErr, wantAt, wantAtErr)
		}
	})
}
