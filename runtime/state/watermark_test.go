package state

import (
	"context"
	"strconv"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestAMeasuringUnitResumesWhereItCommitted: a unit that measures its input keeps what it measured
// in its state hash, and one that starts again (another process, after a crash) measures on from
// there, even for the batch it had begun before it read it: a message far behind what was measured
// before the restart carries that, not its own time.
func TestAMeasuringUnitResumesWhereItCommitted(t *testing.T) {
	_, c := open(t)
	ctx := context.Background()
	e, diags := hclsyntax.ParseExpression([]byte("msg.ts"), "t.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, diags := expr.Compile(e, &expr.Scope{Roots: []string{"msg"}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	spec := Spec{Domains: []flow.TimeDomain{{Name: "msg.ts", Expr: p}}, Own: 0, Measures: true, Carries: []int{0}}
	msg := func(ts int) *stages.Message {
		m := stages.NewMessage("", []byte(`{"ts":`+strconv.Itoa(ts)+`}`), nil)
		return &m
	}
	first := NewWatermarks(spec)
	first.Begin()
	if err := first.Resume(ctx, c, "state"); err != nil {
		t.Fatal(err)
	}
	first.Observe([]*stages.Message{msg(100), msg(300), msg(200)})
	raw := first.Measured()
	if string(raw) != "msg.ts=300" {
		t.Fatalf("measured %q, want msg.ts=300", raw)
	}
	if err := c.Universal().HSet(ctx, "state", redis.MeasuredField, raw).Err(); err != nil { // the commit
		t.Fatal(err)
	}
	first.Commit()
	if again := first.Measured(); again != nil {
		t.Fatalf("measured %q again with nothing new", again)
	}

	second := NewWatermarks(spec)
	second.Begin() // as a worker does: the batch begins, then the watermarks are read
	if err := second.Resume(ctx, c, "state"); err != nil {
		t.Fatal(err)
	}
	late := msg(50)
	own := second.Observe([]*stages.Message{late})
	if own[0] != 300 || late.Headers[stages.WatermarkHeaderOf("msg.ts")] != "300" {
		t.Fatalf("after the restart, a message of 50 has watermark %d and carries %q; want 300 for both",
			own[0], late.Headers[stages.WatermarkHeaderOf("msg.ts")])
	}
}
