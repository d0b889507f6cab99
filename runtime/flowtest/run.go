package flowtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// timedSend is one message a step sends, at its time.
type timedSend struct {
	at     time.Duration // from the step's start
	topic  string        // the topic it goes into, or
	source string        // the source that produces it
	where  string        // "topic.NAME" or "source.NAME", as the test named it
	msg    testfile.Message
}

// execute runs one run block's steps and checks its expectations, into res.
func (h *harness) execute(ctx context.Context, run *testfile.Run, res *RunResult) {
	start, err := h.mark(ctx)
	if err != nil {
		res.Err = err
		return
	}
	var sent []Arrived
	for _, step := range run.Steps {
		if step.Crash {
			if err := h.crash(ctx); err != nil {
				res.Err = fmt.Errorf("%s: starting the pipeline again after the crash: %w", rangeString(step.Range), err)
				return
			}
		}
		sends, err := h.sends(step)
		if err != nil {
			res.Err = err
			return
		}
		for _, s := range sends {
			sent = append(sent, Arrived{Key: s.msg.Key, Payload: s.msg.Payload, Where: s.where})
		}
		if err := h.advance(ctx, step.Advance, sends); err != nil {
			if errors.Is(err, errNotDrained) {
				err = fmt.Errorf("%s: %w", rangeString(step.Range), err)
			}
			res.Err = err // a send's error names its message's line
			return
		}
		if len(step.Expect)+len(step.ExpectDeadLetters)+len(step.Asserts) > 0 {
			s, err := h.observe(ctx, start)
			if err != nil {
				res.Err = err
				return
			}
			h.check(step.Expect, step.ExpectDeadLetters, step.Asserts, s, sent, res)
		}
	}
	s, err := h.observe(ctx, start)
	if err != nil {
		res.Err = err
		return
	}
	h.check(run.Expect, run.ExpectDeadLetters, run.Asserts, s, sent, res)
	res.Seen, res.DeadLetters = s.arrivals, s.deadLetters
}

// sends lists the messages a step sends, with the topic or source each goes to.
func (h *harness) sends(step *testfile.Step) ([]timedSend, error) {
	var out []timedSend
	for _, s := range step.Sends {
		where := "topic." + s.Topic
		if s.Source != "" {
			where = "source." + s.Source
		}
		for _, m := range s.Messages {
			out = append(out, timedSend{at: m.At, topic: s.Topic, source: s.Source, where: where, msg: m})
		}
	}
	return out, nil
}

// send hands messages to their sources, which produce them as their own, and writes those for
// topics as the pipeline's publishers would (flowrun produce).
func (h *harness) send(ctx context.Context, sends []timedSend) error {
	var pub *runtime.Publisher
	defer func() {
		if pub != nil {
			_ = pub.Close(ctx)
		}
	}()
	for len(sends) > 0 {
		if s := sends[0]; s.source != "" {
			if stream, ok := h.streamSources[s.source]; ok {
				// A redis_stream source reads what others XADD: the message goes into its stream.
				entry := redis.Entry{Key: s.msg.Key, Payload: s.msg.Payload}
				if err := h.live.client.Append(ctx, []redis.Output{{Stream: stream.Stream, Entry: entry}}); err != nil {
					return fmt.Errorf("%s: sending a message to %s: %w", rangeString(s.msg.Range), s.where, err)
				}
			} else {
				h.feeds[s.source].push(s.msg)
			}
			sends = sends[1:]
			continue
		}
		n := 1 // the messages for one topic in a row go in one batch, in their order
		for n < len(sends) && sends[n].topic == sends[0].topic && sends[n].source == "" {
			n++
		}
		batch := make([]stages.Message, n)
		for i, s := range sends[:n] {
			batch[i] = stages.NewMessage(s.msg.Key, s.msg.Payload, nil)
		}
		if pub == nil {
			var err error
			if pub, err = runtime.NewPublisherWith(h.live.client, h.plan, runtime.PublisherOptions{Clock: h.clock}); err != nil {
				return err
			}
		}
		if err := pub.PublishBatch(ctx, sends[0].topic, batch); err != nil {
			at := sends[0]
			var bad *runtime.MessageError
			if errors.As(err, &bad) && bad.Index < n {
				at = sends[bad.Index]
				err = bad.Err
			}
			return fmt.Errorf("%s: sending a message to %s: %w", rangeString(at.msg.Range), at.where, err)
		}
		sends = sends[n:]
	}
	return nil
}

// check checks expectations over what the run saw, appending their failures to res.
func (h *harness) check(expects []*testfile.Expect, deadLetters []*testfile.ExpectDeadLetters, asserts []*testfile.Assert,
	s *seen, sent []Arrived, res *RunResult) {
	facts := h.facts(s, sent)
	for _, e := range expects {
		where := "sink." + e.Sink
		if e.Sink == "" {
			where = "topic." + e.Topic
		}
		arrived := s.arrivals[where]
		if h.opts.Update && e.File != "" {
			if e.HasMessages && CompareMessages(e, arrived) == nil {
				continue // the golden file holds what arrived: leave it as it is
			}
			if err := writeGolden(e.File, arrived); err != nil {
				res.Failures = append(res.Failures, Failure{Range: e.Range, Summary: "cannot update the golden file: " + err.Error()})
			} else {
				res.Updated = append(res.Updated, e.File)
			}
			continue
		}
		if f := CompareMessages(e, arrived); f != nil {
			Explain(f, e, arrived, facts)
			res.Failures = append(res.Failures, *f)
		}
	}
	for _, e := range deadLetters {
		node := e.NodeType + "." + e.Node
		var mine []DeadLetter
		for _, dl := range s.deadLetters {
			if dl.Node == node {
				mine = append(mine, dl)
			}
		}
		if f := CompareDeadLetters(e, mine); f != nil {
			res.Failures = append(res.Failures, *f)
		}
	}
	if len(asserts) == 0 {
		return
	}
	scope, err := h.assertScope(s)
	if err != nil {
		res.Err = err
		return
	}
	for _, a := range asserts {
		ok, diags := a.Eval(scope)
		switch {
		case diags.HasErrors():
			res.Failures = append(res.Failures, Failure{Range: a.Range, Summary: "the condition cannot be evaluated: " + diagnosticsText(diags)})
		case !ok:
			msg := a.ErrorMessage
			if msg == "" {
				msg = "the condition is false"
			}
			res.Failures = append(res.Failures, Failure{Range: a.Range, Summary: msg, Diff: referencedValues(a.Condition, scope)})
		}
	}
}

// facts gathers what happened during the run, for the why of a failure.
func (h *harness) facts(s *seen, sent []Arrived) Facts {
	f := Facts{Sent: sent, Arrivals: s.arrivals, DeadLetters: s.deadLetters, Dropped: s.dropped, Waiting: s.waiting}
	add := func(typ, name, kind string, condition string) {
		c := s.counters[typ+"."+name]
		f.Nodes = append(f.Nodes, NodeFacts{Name: typ + "." + name, Kind: kind, In: c.in, Out: c.out, Filtered: c.filtered,
			Dropped: c.dropped, Absorbed: c.absorbed, DeadLettered: c.deadLettered, InFlight: c.inFlight, Retries: c.retries,
			Late: c.late, Condition: condition})
	}
	for _, src := range h.plan.Sources {
		add("source", src.Name, src.Kind, "")
	}
	for _, st := range h.plan.Stages {
		condition := ""
		if kind, err := stages.StageKindOf(st); err == nil && kind.TraitsFor(st.Config).Conditional {
			condition = fmt.Sprintf("%s:%d", st.Range.Filename, st.Range.Start.Line)
		}
		add("stage", st.Name, st.Kind, condition)
	}
	for _, sk := range h.plan.Sinks {
		condition := ""
		if sk.Where != nil {
			condition = fmt.Sprintf("%s:%d", sk.Range.Filename, sk.Range.Start.Line)
		}
		add("sink", sk.Name, sk.Kind, condition)
	}
	return f
}

// assertScope is what an assert's condition reads: output, dead_letters and metrics.
func (h *harness) assertScope(s *seen) (map[string]cty.Value, error) {
	output := map[string]cty.Value{}
	for _, t := range h.plan.Topics {
		v, err := payloadList(s.arrivals["topic."+t.Name])
		if err != nil {
			return nil, err
		}
		output[t.Name] = v
	}
	for _, sk := range h.plan.Sinks { // a sink's name wins over a topic's
		v, err := payloadList(s.arrivals["sink."+sk.Name])
		if err != nil {
			return nil, err
		}
		output[sk.Name] = v
	}
	deadLetters := map[string][]cty.Value{}
	metrics := map[string]cty.Value{}
	for name, c := range s.counters {
		node := name[strings.IndexByte(name, '.')+1:]
		values := map[string]cty.Value{}
		for name, v := range c.valuesByAnyName() {
			values[name] = cty.NumberIntVal(v)
		}
		metrics[node] = cty.ObjectVal(values)
		deadLetters[node] = nil
	}
	for _, dl := range s.deadLetters {
		payload, err := jsonValue(dl.Payload)
		if err != nil {
			return nil, err
		}
		node := dl.Node[strings.IndexByte(dl.Node, '.')+1:]
		deadLetters[node] = append(deadLetters[node], cty.ObjectVal(map[string]cty.Value{
			"payload": payload, "reason": cty.StringVal(dl.Reason), "attempts": cty.NumberIntVal(int64(dl.Attempts)),
			"key": cty.StringVal(dl.Key),
		}))
	}
	dl := map[string]cty.Value{}
	for node, list := range deadLetters {
		dl[node] = cty.TupleVal(list)
		if len(list) == 0 {
			dl[node] = cty.EmptyTupleVal
		}
	}
	return map[string]cty.Value{
		"output": cty.ObjectVal(output), "dead_letters": cty.ObjectVal(dl), "metrics": cty.ObjectVal(metrics),
	}, nil
}

// payloadList is the payloads of messages as a tuple of values.
func payloadList(msgs []Arrived) (cty.Value, error) {
	if len(msgs) == 0 {
		return cty.EmptyTupleVal, nil
	}
	vals := make([]cty.Value, len(msgs))
	for i, m := range msgs {
		v, err := jsonValue(m.Payload)
		if err != nil {
			return cty.NilVal, err
		}
		vals[i] = v
	}
	return cty.TupleVal(vals), nil
}

// jsonValue converts a JSON document to a cty value; nothing (no payload) is null.
func jsonValue(b []byte) (cty.Value, error) {
	if len(b) == 0 {
		return cty.NullVal(cty.DynamicPseudoType), nil
	}
	t, err := ctyjson.ImpliedType(b)
	if err != nil {
		return cty.NilVal, err
	}
	return ctyjson.Unmarshal(b, t)
}

// referencedValues shows the values of what a failed condition refers to, one per line.
func referencedValues(e hcl.Expression, scope map[string]cty.Value) string {
	var lines []string
	seenRef := map[string]bool{}
	for _, t := range e.Variables() {
		v, diags := t.TraverseAbs(&hcl.EvalContext{Variables: scope})
		if diags.HasErrors() {
			continue
		}
		name := expr.TraversalText(t)
		if seenRef[name] {
			continue
		}
		seenRef[name] = true
		b, err := ctyjson.Marshal(v, v.Type())
		if err != nil {
			continue
		}
		lines = append(lines, name+" = "+string(b))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// writeGolden writes what arrived as the JSON lines of a golden file: the payload, or the
// { key, payload } form when the message has a key. Only the order within a key is given (the
// partitions run in parallel), so the lines go by key, each key's in the order they arrived: the
// same messages make the same file.
func writeGolden(path string, arrived []Arrived) error {
	arrived = append([]Arrived(nil), arrived...)
	sort.SliceStable(arrived, func(i, j int) bool { return arrived[i].Key < arrived[j].Key })
	var buf bytes.Buffer
	for _, a := range arrived {
		line := a.Payload
		if a.Key != "" {
			var err error
			if line, err = json.Marshal(struct {
				Key     string          `json:"key"`
				Payload json.RawMessage `json:"payload"`
			}{a.Key, a.Payload}); err != nil {
				return err
			}
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func rangeString(r hcl.Range) string {
	if r.Filename == "" {
		return "test"
	}
	return fmt.Sprintf("%s:%d", r.Filename, r.Start.Line)
}

func diagnosticsText(diags hcl.Diagnostics) string {
	var parts []string
	for _, d := range diags {
		s := d.Summary
		if d.Detail != "" {
			s += ": " + d.Detail
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
