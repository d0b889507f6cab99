package stages

import (
	"encoding/json"
	"testing"
)

// TestFilePositionEncodesAsJSON: a file source's position, encoded by hand for every line, is what
// encoding/json makes of it, and reads back the same; a path with characters json.Marshal escapes
// for HTML, or that need escaping in JSON at all, reads back the same too.
func TestFilePositionEncodesAsJSON(t *testing.T) {
	for _, p := range []filePosition{
		{Path: "/data/bids.jsonl", Offset: 123456789, Line: 4242, Epoch: NewRunID(), Head: headHash([]byte("{}")), HeadLen: 1024},
		{Path: "", Epoch: "e"},
		{Path: "C:\\data\\\"quoted\"\n\tcafé\u2028.jsonl", Offset: -1, Line: -2},
		{Path: "a<b>&c.jsonl", Offset: 1},
	} {
		got := p.appendJSON(nil)
		var back filePosition
		if err := json.Unmarshal(got, &back); err != nil || back != p {
			t.Errorf("%s reads back as %+v (%v), want %+v", got, back, err, p)
		}
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if p.Path != "a<b>&c.jsonl" && string(got) != string(want) {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
}

// TestPositionEncoderEncodesEveryPositionWhole: the encoder, which encodes a reading's path, epoch
// and head once, makes each line's position as appendJSON makes it whole, within the file's first
// bytes (whose head changes with every line) and past them.
func TestPositionEncoderEncodesEveryPositionWhole(t *testing.T) {
	head := []byte(`{"a":1}` + "\n" + `{"b":"` + string(make([]byte, 2000)) + `"}`)[:fingerprintLen]
	e := newPositionEncoder(filePosition{Path: "in<1>.jsonl", Epoch: "e1"}, head)
	for i, offset := range []int64{0, 8, 500, 1023, 1024, 1025, 5000, 5000, 9} {
		want := filePosition{Path: "in<1>.jsonl", Epoch: "e1", Offset: offset, Line: int64(i)}
		want.HeadLen = int(min(offset, fingerprintLen))
		want.Head = headHash(head[:want.HeadLen])
		if got := e.encode(offset, int64(i)); got != string(want.appendJSON(nil)) {
			t.Errorf("at %d: %s, want %s", offset, got, want.appendJSON(nil))
		}
	}
}
