package flowtest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/flowrun/flowrun/flow/testfile"
)

// CompareMessages checks an expect block against the messages that arrived at its sink or topic,
// in arrival order, and returns nil when it holds.
//
// Messages are compared as JSON values. An expected message with a key matches only a message of
// that key; one without matches any key. In MatchExact the arrivals must be the expected messages
// and each key's messages must have arrived in the order the expectation lists them: partitions
// run concurrently, so the order across keys is free. MatchUnordered wants the same messages in any
// order, MatchSubset at least the expected ones. HasCount wants exactly Count arrivals, on top of
// the messages when both are given.
func CompareMessages(e *testfile.Expect, actual []Arrived) *Failure {
	c := newComparison(e, actual)
	var problems []string
	var diff string
	if e.HasCount && len(actual) != e.Count {
		problems = append(problems, fmt.Sprintf("expected %d %s, %d arrived", e.Count, plural(e.Count, "message", "messages"), len(actual)))
	}
	if e.HasMessages {
		if p, d := c.compare(); p != "" {
			problems = append(problems, p)
			diff = d
		} else if len(problems) > 0 {
			diff = c.multisetDiff() // the messages hold but the count does not: show them all
		}
	}
	if len(problems) == 0 {
		return nil
	}
	if diff == "" {
		diff = arrivalList(c.act)
	}
	return &Failure{Range: e.Range, Summary: c.where + ": " + strings.Join(problems, "; "), Diff: diff}
}

// A message is an expected or arrived message, decoded for comparison.
type message struct {
	key    string
	hasKey bool // for expectations, whether the test gave a key; for arrivals, whether it is not ""
	val    value
	at     string // where an expected message is written ("line 12", "out.jsonl:3"); "" for arrivals
}

// matches reports whether the arrival a satisfies the expected message m.
func (m message) matches(a message) bool {
	return m.val.equal(a.val) && (!m.hasKey || m.key == a.key)
}

// text renders the message as a diff line: its canonical JSON, after its key when keys matter.
func (m message) text(withKey bool) string {
	if withKey && m.hasKey {
		return "key=" + keyText(m.key) + " " + m.val.canon
	}
	return m.val.canon
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_.:/@-]+$`)

// keyText writes a key bare when that is unambiguous, quoted otherwise (empty, spaces, quotes).
func keyText(k string) string {
	if plainKey.MatchString(k) {
		return k
	}
	return strconv.Quote(k)
}

// comparison holds one expect block's decoded messages and their pairing.
type comparison struct {
	where      string // "sink.out"
	mode       string
	exp, act   []message
	keysMatter bool   // some expected message gives a key
	pair       []int  // pair[i]: the arrival matched to expected message i, or -1
	taken      []bool // taken[j]: arrival j is matched
}

func newComparison(e *testfile.Expect, actual []Arrived) *comparison {
	c := &comparison{where: expectWhere(e), mode: e.Match}
	if c.mode == "" {
		c.mode = testfile.MatchExact
	}
	for _, m := range e.Messages {
		c.exp = append(c.exp, message{key: m.Key, hasKey: m.HasKey, val: parseValue(m.Payload), at: messageAt(m, e)})
		c.keysMatter = c.keysMatter || m.HasKey
	}
	for _, a := range actual {
		// An arrival's empty key is shown as none; matching reads hasKey of expectations only.
		c.act = append(c.act, message{key: a.Key, hasKey: a.Key != "", val: parseValue(a.Payload)})
	}
	c.pair, c.taken = matchMultiset(c.exp, c.act)
	return c
}

// expectWhere names the expectation's sink or topic as Arrived.Where does.
func expectWhere(e *testfile.Expect) string {
	name, kind := e.Sink, "sink."
	if name == "" {
		name, kind = e.Topic, "topic."
	}
	if strings.HasPrefix(name, kind) {
		return name
	}
	return kind + name
}

// messageAt says where an expected message is written, when the decoder recorded it: its line in
// the test file, or file:line in a golden file.
func messageAt(m testfile.Message, e *testfile.Expect) string {
	if m.Range.Start.Line == 0 {
		return ""
	}
	if m.Range.Filename == e.Range.Filename || m.Range.Filename == "" {
		return fmt.Sprintf("line %d", m.Range.Start.Line)
	}
	return fmt.Sprintf("%s:%d", m.Range.Filename, m.Range.Start.Line)
}

// matchMultiset pairs expected messages with equal arrivals, as many as can be. Expectations with a
// key are paired first: they can only take an arrival of their key, while one without a key can
// take any, so this order pairs the most. Each takes the earliest free arrival. Invalid JSON
// compares by its bytes, which never equal the canonical text of a valid value.
func matchMultiset(exp, act []message) (pair []int, taken []bool) {
	pair = make([]int, len(exp))
	taken = make([]bool, len(act))
	byValueKey := map[string][]int{} // canonical value and key → arrivals, in arrival order
	byValue := map[string][]int{}
	for j, a := range act {
		vk := a.val.canon + "\x00" + a.key
		byValueKey[vk] = append(byValueKey[vk], j)
		byValue[a.val.canon] = append(byValue[a.val.canon], j)
	}
	take := func(queue map[string][]int, k string) int {
		q := queue[k]
		for len(q) > 0 && taken[q[0]] {
			q = q[1:]
		}
		queue[k] = q
		if len(q) == 0 {
			return -1
		}
		taken[q[0]] = true
		return q[0]
	}
	for i, m := range exp {
		pair[i] = -1
		if m.hasKey {
			pair[i] = take(byValueKey, m.val.canon+"\x00"+m.key)
		}
	}
	for i, m := range exp {
		if !m.hasKey {
			pair[i] = take(byValue, m.val.canon)
		}
	}
	return pair, taken
}

// compare checks the messages in the expectation's mode and returns what is wrong (for the
// summary) and the diff, or "" when they hold.
func (c *comparison) compare() (problem, diff string) {
	missing, extra := 0, 0
	for _, j := range c.pair {
		if j < 0 {
			missing++
		}
	}
	for _, t := range c.taken {
		if !t {
			extra++
		}
	}
	if c.mode == testfile.MatchSubset {
		extra = 0 // other arrivals are allowed
	}
	switch {
	case missing > 0 && extra > 0:
		problem = fmt.Sprintf("%d of %d expected %s did not arrive; %d unexpected arrived",
			missing, len(c.exp), plural(len(c.exp), "message", "messages"), extra)
	case missing > 0:
		problem = fmt.Sprintf("%d of %d expected %s did not arrive",
			missing, len(c.exp), plural(len(c.exp), "message", "messages"))
	case extra > 0:
		problem = fmt.Sprintf("%d unexpected %s arrived", extra, plural(extra, "message", "messages"))
	case c.mode == testfile.MatchExact:
		return c.checkOrder()
	default:
		return "", ""
	}
	return problem, c.multisetDiff()
}

// maxDiffChanges bounds the removed and the added lines a diff lists; maxSubsetExtras the other
// arrivals a subset expectation lists, where they are allowed and only context.
const (
	maxDiffChanges  = 50
	maxSubsetExtras = 10
)

// multisetDiff lists the expected messages in the order written, matched (' ') or not ('-', with
// the closest free arrival), then the arrivals nothing expected ('+'), in arrival order.
func (c *comparison) multisetDiff() string {
	var lines []diffLine
	removed := 0
	for i, m := range c.exp {
		if j := c.pair[i]; j >= 0 {
			shown := m
			shown.key, shown.hasKey = c.act[j].key, c.act[j].hasKey
			lines = append(lines, diffLine{op: ' ', text: shown.text(c.keysMatter)})
			continue
		}
		removed++
		if removed > maxDiffChanges {
			continue
		}
		l := diffLine{op: '-', text: m.text(c.keysMatter)}
		if m.at != "" {
			l.text += "  (" + m.at + ")"
		}
		if note := c.closestNote(m); note != "" {
			l.notes = append(l.notes, note)
		}
		lines = append(lines, l)
	}
	if removed > maxDiffChanges {
		lines = append(lines, diffLine{op: '-', text: fmt.Sprintf("... %d more expected messages did not arrive", removed-maxDiffChanges)})
	}
	limit := maxDiffChanges
	if c.mode == testfile.MatchSubset {
		limit = maxSubsetExtras
	}
	added := 0
	for j, a := range c.act {
		if c.taken[j] {
			continue
		}
		added++
		if added <= limit {
			lines = append(lines, diffLine{op: '+', text: a.text(c.keysMatter)})
		}
	}
	if added > limit {
		lines = append(lines, diffLine{op: '+', text: fmt.Sprintf("... %d more arrivals", added-limit)})
	}
	legend := "(- expected but did not arrive, + arrived but not expected)"
	if c.mode == testfile.MatchSubset {
		legend = "(- expected but did not arrive, + the other arrivals)"
	}
	return legend + "\n" + renderDiff(lines)
}

// closestNote describes how the free arrival closest to the missing expected message m differs
// from it: the one with the fewest differing fields (a differing key counts as one).
func (c *comparison) closestNote(m message) string {
	best, bestDiffs := -1, []fieldDiff(nil)
	for j, a := range c.act {
		if c.taken[j] {
			continue
		}
		d := differences(m.val, a.val)
		if m.hasKey && m.key != a.key {
			d = append([]fieldDiff{{path: "the key", want: strconv.Quote(m.key), got: strconv.Quote(a.key)}}, d...)
		}
		if best < 0 || len(d) < len(bestDiffs) {
			best, bestDiffs = j, d
		}
	}
	if best < 0 {
		return ""
	}
	return "closest arrival differs in: " + describeDiffs(bestDiffs)
}

// arrivalList lists what arrived, for a count that did not hold with no messages to compare.
func arrivalList(act []message) string {
	if len(act) == 0 {
		return "nothing arrived"
	}
	const shown = 10
	var sb strings.Builder
	fmt.Fprintf(&sb, "arrived (%d):", len(act))
	for i, a := range act {
		if i == shown {
			fmt.Fprintf(&sb, "\n  ... %d more ...", len(act)-shown)
			break
		}
		sb.WriteString("\n  " + a.text(true))
	}
	return sb.String()
}
