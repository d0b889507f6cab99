package stages

import (
	"context"
	"testing"
)

// BenchmarkSetMap decodes a message, sets a field and encodes it again: the path of every map
// stage with a set.
func BenchmarkSetMap(b *testing.B) {
	p := plan(b, `
stage "m" {
  kind   = "map"
  input  = topic.in
  output = topic.a
  set    = { seen = true }
}
`+sinkA)
	proc := processor(b, p, "m")
	payload := []byte(`{"order_id":"o-1","customer_id":"c-42","amount":150.5,"country":"DE","note":"a \"quoted\" word","items":[{"sku":"a","qty":1},{"sku":"b","qty":12345678901234567890}]}`)
	out := make([]Output, 0, 1)
	b.ReportAllocs()
	for b.Loop() {
		m := NewMessage("c-42", payload, nil)
		out, _ = proc.Process(context.Background(), &m, out[:0])
		if _, err := out[0].Message.Payload(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBorrowFieldsOfABid is a topic key read from a line of a file source (Nexmark's q0 keys
// its bids by auction, their first field): what route costs a source for every message.
func BenchmarkBorrowFieldsOfABid(b *testing.B) {
	line := []byte(`{"auction":1002,"bidder":1000,"channel":"Apple","dateTime":1767225600004,"price":1148,"url":"https://example.com/item/262950"}`)
	names := []string{"auction"}
	b.ReportAllocs()
	for b.Loop() {
		m := NewEntryMessage("", line, nil)
		fields, lent, err := m.BorrowFields(names, false)
		if err != nil || fields["auction"] == nil {
			b.Fatal(fields, err)
		}
		ReturnFields(lent)
	}
}
