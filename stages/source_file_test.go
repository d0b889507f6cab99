package stages

import (
	"encoding/json"
	"testing"
)

// TestFilePositionEncodesAsEncodingJSON: a file source's position is written as encoding/json
// writes it.
func TestFilePositionEncodesAsEncodingJSON(t *testing.T) {
	for _, p := range []filePosition{
		{},
		{Path: "/data/bids.jsonl", Offset: 123456789, Line: 42, Epoch: NewRunID(), Head: headHash([]byte("x")), HeadLen: 1024},
		{Path: `C:\\in "quoted" <a&b>.jsonl`, Offset: -1, Line: 1 << 62, Epoch: "e\n\t\x00", Head: "h\u2028", HeadLen: -7},
		{Path: "caf\u00e9/\xff\xfe.jsonl", Epoch: "\x7f", Head: "~"},
	} {
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.encode(); got != string(want) {
			t.Fatalf("encode() = %s, encoding/json: %s", got, want)
		}
	}
}
