package flowtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// value is a JSON payload decoded for comparison. Tests compare messages as JSON values, not as
// bytes: key order and the spelling of numbers (1, 1.0, 1e0) do not matter. Numbers are kept as
// their text (json.Number) and normalized as exact decimals, so 12345678901234567890 and
// 12345678901234567891 differ although they are the same float64.
type value struct {
	v     any    // decoded with UseNumber; unused when !valid
	valid bool   // false: not one JSON value; canon is then the raw bytes, compared as they are
	canon string // canonical text: sorted keys, compact, numbers normalized; equal values, equal text
}

func parseValue(b []byte) value {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return value{canon: string(b)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return value{canon: string(b)} // trailing data: not one value
	}
	var sb strings.Builder
	writeCanonical(&sb, v)
	return value{v: v, valid: true, canon: sb.String()}
}

func (a value) equal(b value) bool { return a.valid == b.valid && a.canon == b.canon }

// writeCanonical writes v compactly with object keys sorted and numbers normalized.
func writeCanonical(sb *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		sb.WriteString("null")
	case bool:
		sb.WriteString(strconv.FormatBool(x))
	case json.Number:
		sb.WriteString(canonicalNumber(string(x)))
	case string:
		sb.WriteString(jsonString(x))
	case []any:
		sb.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				sb.WriteByte(',')
			}
			writeCanonical(sb, e)
		}
		sb.WriteByte(']')
	case map[string]any:
		sb.WriteByte('{')
		for i, k := range sortedKeys(x) {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(jsonString(k))
			sb.WriteByte(':')
			writeCanonical(sb, x[k])
		}
		sb.WriteByte('}')
	}
}

func canonicalOf(v any) string {
	var sb strings.Builder
	writeCanonical(&sb, v)
	return sb.String()
}

// jsonString quotes s as JSON without the HTML escaping of encoding/json (<, >, & stay readable).
func jsonString(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(buf.String(), "\n")
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// canonicalNumber writes a JSON number as an exact decimal in one spelling per value: 1.0, 1 and
// 1e0 all become 1; 1.5e-7 becomes 1.5e-7 and 0.25 stays 0.25. It works on the digits, not through
// float64 or big.Rat: exact for any length, and a huge exponent (1e999999999) costs nothing.
func canonicalNumber(text string) string {
	s := text
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	exp := int64(0)
	if expText != "" {
		e, err := strconv.ParseInt(expText, 10, 64)
		if err != nil || e > 1<<40 || e < -(1<<40) {
			return text // an exponent beyond any use: compare the text as written
		}
		exp = e
	}
	digits := intPart + frac
	exp -= int64(len(frac))
	digits = strings.TrimLeft(digits, "0")
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	digits = trimmed
	if digits == "" {
		return "0" // -0 is 0
	}
	sign := ""
	if neg {
		sign = "-"
	}
	n := int64(len(digits))
	point := n + exp // the value is 0.DIGITS × 10^point
	switch {
	case exp >= 0 && point <= 21:
		return sign + digits + strings.Repeat("0", int(exp))
	case exp < 0 && point > 0:
		return sign + digits[:point] + "." + digits[point:]
	case exp < 0 && point > -6:
		return sign + "0." + strings.Repeat("0", int(-point)) + digits
	}
	out := sign + digits[:1]
	if n > 1 {
		out += "." + digits[1:]
	}
	return out + "e" + strconv.FormatInt(point-1, 10)
}

// A fieldDiff is one place where two JSON values differ, for notes like
// "amount (expected 5, got 6); missing: currency".
type fieldDiff struct {
	path      string // "amount", "customer.id", "items[2]"; "" for the whole value
	want, got string // canonical text; want "" when the field is unexpected, got "" when missing
}

// diffValues lists where got differs from want, field by field through objects and through arrays
// of the same length.
func diffValues(path string, want, got any, out []fieldDiff) []fieldDiff {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			break
		}
		keys := sortedKeys(w)
		for k := range g {
			if _, ok := w[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			wv, inW := w[k]
			gv, inG := g[k]
			p := joinPath(path, k)
			switch {
			case !inG:
				out = append(out, fieldDiff{path: p, want: canonicalOf(wv)})
			case !inW:
				out = append(out, fieldDiff{path: p, got: canonicalOf(gv)})
			default:
				out = diffValues(p, wv, gv, out)
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			break
		}
		for i := range w {
			out = diffValues(fmt.Sprintf("%s[%d]", path, i), w[i], g[i], out)
		}
		return out
	}
	if wc, gc := canonicalOf(want), canonicalOf(got); wc != gc {
		out = append(out, fieldDiff{path: path, want: wc, got: gc})
	}
	return out
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// differences lists where b differs from a; invalid JSON differs as a whole.
func differences(a, b value) []fieldDiff {
	if !a.valid || !b.valid {
		if a.equal(b) {
			return nil
		}
		return []fieldDiff{{want: a.canon, got: b.canon}}
	}
	return diffValues("", a.v, b.v, nil)
}

// describeDiffs renders differences as one note: "amount (expected 5, got 6); missing: currency;
// unexpected: note".
func describeDiffs(diffs []fieldDiff) string {
	var differ, missing, extra []string
	for _, d := range diffs {
		switch {
		case d.got == "":
			missing = append(missing, d.path)
		case d.want == "":
			extra = append(extra, d.path)
		case d.path == "":
			differ = append(differ, fmt.Sprintf("the whole value (expected %s, got %s)", clip(d.want, 40), clip(d.got, 40)))
		default:
			differ = append(differ, fmt.Sprintf("%s (expected %s, got %s)", d.path, clip(d.want, 30), clip(d.got, 30)))
		}
	}
	var parts []string
	if len(differ) > 0 {
		parts = append(parts, strings.Join(differ, ", "))
	}
	if len(missing) > 0 {
		parts = append(parts, "missing: "+strings.Join(missing, ", "))
	}
	if len(extra) > 0 {
		parts = append(parts, "unexpected: "+strings.Join(extra, ", "))
	}
	return strings.Join(parts, "; ")
}

// sharedLeaves counts the fields (leaves, by path) that a and b have with equal values: how much a
// sent message has in common with an expected one that a stage may have reshaped.
func sharedLeaves(a, b any) int {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return 0
		}
		n := 0
		for k, xv := range x {
			if yv, ok := y[k]; ok {
				n += sharedLeaves(xv, yv)
			}
		}
		return n
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			if ok && canonicalOf(x) == canonicalOf(y) {
				return 1
			}
			return 0
		}
		n := 0
		for i := range x {
			n += sharedLeaves(x[i], y[i])
		}
		return n
	}
	if canonicalOf(a) == canonicalOf(b) {
		return 1
	}
	return 0
}

// clip shortens s to at most n runes, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
