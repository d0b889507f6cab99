package testfile

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/flowrun/flowrun/flow"
)

// Decoding messages: the ones a test sends or expects, inline or from a JSON-lines file, and the
// dead letters it expects.

// messageFields are the attributes of a message's wrapped form.
var messageFields = []string{"key", "payload", "at"}

// messages decodes an inline list of messages; at is allowed in sends only.
func (d *decoder) messages(a *hcl.Attribute, allowAt bool) []Message {
	elems, diags := hcl.ExprList(a.Expr)
	if diags.HasErrors() {
		d.errorf(a.Expr.Range(), "Invalid messages", "messages takes a list of objects, such as [{ id = 1 }, { id = 2 }].")
		return nil
	}
	out := []Message{}
	for _, e := range elems {
		v, diags := e.Value(d.ctx)
		d.diags = append(d.diags, diags...)
		if diags.HasErrors() {
			continue
		}
		m, ok := d.message(v, e.Range(), fieldRanges(e), allowAt)
		if ok {
			out = append(out, m)
		}
	}
	return out
}

// fieldRanges returns where each field of an object constructor is written, for diagnostics
// about one field; other expressions have none.
func fieldRanges(e hcl.Expression) map[string]hcl.Range {
	pairs, diags := hcl.ExprMap(e)
	if diags.HasErrors() {
		return nil
	}
	out := map[string]hcl.Range{}
	for _, p := range pairs {
		k, diags := p.Key.Value(nil)
		if !diags.HasErrors() && k.Type() == cty.String && k.IsKnown() && !k.IsNull() {
			out[k.AsString()] = p.Value.Range()
		}
	}
	return out
}

// message decodes one message value written at rng: a payload, or the wrapped form.
func (d *decoder) message(v cty.Value, rng hcl.Range, fields map[string]hcl.Range, allowAt bool) (Message, bool) {
	at := func(name string) hcl.Range {
		if r, ok := fields[name]; ok {
			return r
		}
		return rng
	}
	m := Message{Range: rng}
	if !isObject(v) {
		d.errorf(rng, "Invalid message", "A message is an object: its payload, or the wrapped form { payload = {...}, key = \"...\" }.")
		return m, false
	}
	if !isWrapped(v) {
		payload, ok := d.payload(v, rng)
		m.Payload = payload
		return m, ok
	}
	payload := v.GetAttr("payload")
	if payload.IsNull() && allowAt && v.Type().HasAttribute("key") {
		// A sent message with a key and a null payload: a table's delete of its key.
		m.Payload = []byte("null")
	} else if !isObject(payload) {
		d.errorf(at("payload"), "Invalid payload", "A payload is an object: flowrun messages are JSON objects.")
		return m, false
	}
	if m.Payload == nil {
		var ok bool
		if m.Payload, ok = d.payload(payload, at("payload")); !ok {
			return m, false
		}
	}
	if v.Type().HasAttribute("key") {
		k, err := convert.Convert(v.GetAttr("key"), cty.String)
		if err != nil || k.IsNull() || !k.IsKnown() {
			d.errorf(at("key"), "Invalid key", "A message's key is a string.")
			return m, false
		}
		m.Key, m.HasKey = k.AsString(), true
	}
	if v.Type().HasAttribute("at") {
		if !allowAt {
			d.errorf(at("at"), "Unsupported argument", "at delays a sent message; an expected message has none.")
			return m, false
		}
		s, err := convert.Convert(v.GetAttr("at"), cty.String)
		if err != nil || s.IsNull() || !s.IsKnown() {
			d.errorf(at("at"), "Invalid at", "at is a delay from the start of the step, such as \"+5s\".")
			return m, false
		}
		dur, perr := flow.ParseDuration(strings.TrimPrefix(s.AsString(), "+"))
		if perr != nil {
			d.errorf(at("at"), "Invalid at", "at: %s.", perr)
			return m, false
		}
		m.At = dur
	}
	return m, true
}

// isObject reports whether a value can be a JSON object. Maps count: hcl gives an object's
// attributes of one type as one when converted, and JSON cannot tell.
func isObject(v cty.Value) bool {
	return !v.IsNull() && v.IsKnown() && (v.Type().IsObjectType() || v.Type().IsMapType())
}

// isWrapped reports whether a message object is the wrapped form: it has a payload and nothing but
// key, payload and at. Any other object is the payload itself.
func isWrapped(v cty.Value) bool {
	if !v.Type().IsObjectType() || !v.Type().HasAttribute("payload") {
		return false
	}
	for name := range v.Type().AttributeTypes() {
		if !slices.Contains(messageFields, name) {
			return false
		}
	}
	return true
}

// payload renders a payload as compact JSON, keys sorted, numbers as written (integers stay integers).
func (d *decoder) payload(v cty.Value, rng hcl.Range) ([]byte, bool) {
	if !v.IsWhollyKnown() {
		d.errorf(rng, "Invalid payload", "A payload must be known when the test is read.")
		return nil, false
	}
	b, err := ctyjson.Marshal(v, v.Type())
	if err != nil {
		d.errorf(rng, "Invalid payload", "The payload cannot be written as JSON: %s.", err)
		return nil, false
	}
	return b, true
}

// messagesFile reads a JSON-lines file of messages, relative to the test file. A missing file is
// an error when mustExist; otherwise it returns no messages and false.
func (d *decoder) messagesFile(a *hcl.Attribute, allowAt, mustExist bool) ([]Message, string, bool) {
	name, ok := d.string(a)
	if !ok {
		return nil, "", false
	}
	path := name
	if !filepath.IsAbs(path) {
		path = filepath.Join(d.dir, path)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		if !os.IsNotExist(err) || mustExist {
			d.errorf(a.Expr.Range(), "Cannot read messages file", "%s: %s.", path, flow.DescribeFSError(err))
		}
		return nil, path, false
	}
	out := []Message{}
	offset := 0
	for i, line := range bytes.SplitAfter(src, []byte("\n")) {
		start := offset
		offset += len(line)
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		rng := hcl.Range{
			Filename: path,
			Start:    hcl.Pos{Line: i + 1, Column: 1, Byte: start},
			End:      hcl.Pos{Line: i + 1, Column: len(line) + 1, Byte: start + len(line)},
		}
		v, err := jsonValue(line)
		if err != nil {
			d.errorf(rng, "Invalid message", "Each line of a messages file is a JSON object: %s.", err)
			continue
		}
		if m, ok := d.message(v, rng, nil, allowAt); ok {
			out = append(out, m)
		}
	}
	return out, path, true
}

// jsonValue decodes one JSON document as cty does, so that a file's message and an inline one
// decode alike.
func jsonValue(src []byte) (cty.Value, error) {
	ty, err := ctyjson.ImpliedType(src)
	if err != nil {
		return cty.NilVal, err
	}
	return ctyjson.Unmarshal(src, ty)
}

// deadLetterFields are the fields of an expected dead letter.
var deadLetterFields = []string{"payload", "reason", "attempts"}

// deadLetters decodes the messages of an expect_dead_letters block.
func (d *decoder) deadLetters(a *hcl.Attribute) []DeadLetter {
	elems, diags := hcl.ExprList(a.Expr)
	if diags.HasErrors() {
		d.errorf(a.Expr.Range(), "Invalid messages", "messages takes a list of objects of payload, reason and attempts.")
		return nil
	}
	out := []DeadLetter{}
	for _, e := range elems {
		v, diags := e.Value(d.ctx)
		d.diags = append(d.diags, diags...)
		if diags.HasErrors() {
			continue
		}
		if dl, ok := d.deadLetter(v, e.Range(), fieldRanges(e)); ok {
			out = append(out, dl)
		}
	}
	return out
}

func (d *decoder) deadLetter(v cty.Value, rng hcl.Range, fields map[string]hcl.Range) (DeadLetter, bool) {
	at := func(name string) hcl.Range {
		if r, ok := fields[name]; ok {
			return r
		}
		return rng
	}
	dl := DeadLetter{Range: rng}
	if !v.Type().IsObjectType() || v.IsNull() {
		d.errorf(rng, "Invalid dead letter", "An expected dead letter is an object of payload, reason and attempts, each optional.")
		return dl, false
	}
	ok := true
	for _, name := range slices.Sorted(maps.Keys(v.Type().AttributeTypes())) {
		if !slices.Contains(deadLetterFields, name) {
			d.errorf(at(name), "Unsupported argument", "An expected dead letter has no field %q; its fields are %s.%s",
				name, flow.QuotedList(deadLetterFields), flow.DidYouMean(name, deadLetterFields))
			ok = false
		}
	}
	if v.Type().HasAttribute("payload") {
		p := v.GetAttr("payload")
		if !isObject(p) {
			d.errorf(at("payload"), "Invalid payload", "A payload is an object: flowrun messages are JSON objects.")
			return dl, false
		}
		var pok bool
		dl.Payload, pok = d.payload(p, at("payload"))
		ok = ok && pok
	}
	if v.Type().HasAttribute("reason") {
		r, err := convert.Convert(v.GetAttr("reason"), cty.String)
		if err != nil || r.IsNull() || !r.IsKnown() {
			d.errorf(at("reason"), "Invalid reason", "reason is a string, found in the dead letter's reason.")
			return dl, false
		}
		dl.Reason = r.AsString()
	}
	if v.Type().HasAttribute("attempts") {
		n, err := convert.Convert(v.GetAttr("attempts"), cty.Number)
		attempts, whole := 0, false
		if err == nil {
			attempts, whole = wholeNumber(n)
		}
		if !whole || attempts < 1 {
			d.errorf(at("attempts"), "Invalid attempts", "attempts is a whole number of at least 1.")
			return dl, false
		}
		dl.Attempts = attempts
	}
	return dl, ok
}
