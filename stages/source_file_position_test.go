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
