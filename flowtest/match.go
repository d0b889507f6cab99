package flowtest

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/flowrun/flowrun/flow"
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
func CompareMessages(e *flow.TestExpect, actual []Arrived) *Failure {
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

func newComparison(e *flow.TestExpect, actual []Arrived) *comparison {
	c := &comparison{where: expectWhere(e), mode: e.Match}
	if c.mode == "" {
		c.mode = flow.MatchExact
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
func expectWhere(e *flow.TestExpect) string {
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
func messageAt(m flow.TestMessage, e *flow.TestExpect) string {
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
	if c.mode == flow.MatchSubset {
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
	case c.mode == flow.MatchExact:
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
	if c.mode == flow.MatchSubset {
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
	if c.mode == flow.MatchSubset {
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

// maxOrderBranches bounds the search of checkOrder: the points where equal messages of different
// keys could each be the next expected one.
const maxOrderBranches = 20000

// checkOrder checks, once the messages are the expected ones, that each key's arrivals follow the
// expectation's order. When the expectation gives keys this is direct. When it does not, the
// expected list must be split among the arrivals' keys so that each key's arrivals, in arrival
// order, are a subsequence of it; equal payloads under different keys make the split ambiguous,
// so checkOrder searches: it walks the expected list and, for each message, takes the next arrival
// of a key whose next arrival equals it, trying the other such keys when that fails later.
func (c *comparison) checkOrder() (problem, diff string) {
	s := newOrderSearch(c.exp, c.act)
	if s.from(0) {
		return "", ""
	}
	if s.exhausted {
		return "the order of equal messages under different keys could not be checked (too many ways to pair them); give the expected messages keys", ""
	}
	key, ok := s.stuckKey()
	if !ok {
		return "the messages arrived in an order that no split of the expected list among their keys allows", ""
	}
	return fmt.Sprintf("the messages of key %s arrived in another order", strconv.Quote(key)), c.orderDiff(key)
}

// orderDiff shows one key's messages in the expected order against the order they arrived in.
func (c *comparison) orderDiff(key string) string {
	var want, got []string
	for _, j := range c.pair { // in expected order
		if j >= 0 && c.act[j].key == key {
			want = append(want, c.act[j].text(true))
		}
	}
	for _, a := range c.act {
		if a.key == key {
			got = append(got, a.text(true))
		}
	}
	lines := sequenceDiff(want, got)
	changed := false
	for _, l := range lines {
		changed = changed || l.op != ' '
	}
	if !changed {
		// This key's order fits on its own; it is the split among keys that fails. List them all.
		return "(each key's messages fit the expected order on their own, but not all at once; arrived:)\n" + arrivalList(c.act)
	}
	return fmt.Sprintf("(the messages of key %s: - in the expected order, + in the order they arrived)\n", strconv.Quote(key)) +
		renderDiff(lines)
}

// orderSearch is the state of checkOrder's search.
type orderSearch struct {
	exp, act []message
	keys     []string         // the arrivals' keys, in order of first arrival
	seqs     [][]int          // seqs[k]: the arrivals of keys[k], in arrival order
	class    []int            // class[k]: the first key whose arrivals are the same values as keys[k]'s
	keyIndex map[string]int   // key → k
	pos      []int            // pos[k]: how many of keys[k]'s arrivals are paired so far
	heads    map[string][]int // canonical value → the keys whose next arrival it is, ascending

	seen      map[string]bool // branch states already tried
	branches  int
	exhausted bool
	stuck     int   // the furthest expected message that no key's next arrival fitted; -1: none
	stuckPos  []int // pos then
}

func newOrderSearch(exp, act []message) *orderSearch {
	s := &orderSearch{exp: exp, act: act, keyIndex: map[string]int{}, heads: map[string][]int{},
		seen: map[string]bool{}, stuck: -1}
	for j, a := range act {
		k, ok := s.keyIndex[a.key]
		if !ok {
			k = len(s.keys)
			s.keyIndex[a.key] = k
			s.keys = append(s.keys, a.key)
			s.seqs = append(s.seqs, nil)
		}
		s.seqs[k] = append(s.seqs[k], j)
	}
	s.pos = make([]int, len(s.keys))
	s.class = make([]int, len(s.keys))
	classOf := map[string]int{}
	for k, seq := range s.seqs {
		var sb strings.Builder
		for _, j := range seq {
			sb.WriteString(act[j].val.canon)
			sb.WriteByte(0)
		}
		if first, ok := classOf[sb.String()]; ok {
			s.class[k] = first
		} else {
			classOf[sb.String()] = k
			s.class[k] = k
		}
		s.addHead(k)
	}
	return s
}

// head is the canonical value of keys[k]'s next arrival.
func (s *orderSearch) head(k int) (string, bool) {
	if s.pos[k] == len(s.seqs[k]) {
		return "", false
	}
	return s.act[s.seqs[k][s.pos[k]]].val.canon, true
}

func (s *orderSearch) addHead(k int) {
	if v, ok := s.head(k); ok {
		h := s.heads[v]
		i := sort.SearchInts(h, k)
		s.heads[v] = append(h[:i], append([]int{k}, h[i:]...)...)
	}
}

func (s *orderSearch) removeHead(k int) {
	if v, ok := s.head(k); ok {
		h := s.heads[v]
		i := sort.SearchInts(h, k)
		s.heads[v] = append(h[:i], h[i+1:]...)
	}
}

// advance pairs keys[k]'s next arrival; retreat takes that back.
func (s *orderSearch) advance(k int) { s.removeHead(k); s.pos[k]++; s.addHead(k) }
func (s *orderSearch) retreat(k int) { s.removeHead(k); s.pos[k]--; s.addHead(k) }

// from reports whether the expected messages from i on can be paired with the rest of the
// arrivals. Forced steps (one key fits) loop; choices recurse. On false the state is as it was.
func (s *orderSearch) from(i int) bool {
	var forced []int
	undo := func() {
		for n := len(forced) - 1; n >= 0; n-- {
			s.retreat(forced[n])
		}
	}
	for {
		if i == len(s.exp) {
			return true
		}
		cands := s.candidates(s.exp[i])
		switch {
		case len(cands) == 1:
			s.advance(cands[0])
			forced = append(forced, cands[0])
			i++
			continue
		case len(cands) == 0:
			if i > s.stuck {
				s.stuck = i
				s.stuckPos = append(s.stuckPos[:0], s.pos...)
			}
			undo()
			return false
		}
		state := s.stateKey()
		if s.seen[state] {
			undo()
			return false
		}
		if s.branches == maxOrderBranches {
			s.exhausted = true
			undo()
			return false
		}
		s.seen[state] = true
		s.branches++
		for _, k := range cands {
			s.advance(k)
			if s.from(i + 1) {
				return true
			}
			s.retreat(k)
		}
		undo()
		return false
	}
}

// candidates are the keys whose next arrival satisfies m, one per class and position: keys with
// the same values at the same point are interchangeable.
func (s *orderSearch) candidates(m message) []int {
	if m.hasKey {
		if k, ok := s.keyIndex[m.key]; ok {
			if v, ok := s.head(k); ok && v == m.val.canon {
				return []int{k}
			}
		}
		return nil
	}
	h := s.heads[m.val.canon]
	if len(h) <= 1 {
		return append([]int(nil), h...) // a copy: advancing rewrites heads
	}
	type slot struct{ class, pos int }
	tried := map[slot]bool{}
	var out []int
	for _, k := range h {
		if sl := (slot{s.class[k], s.pos[k]}); !tried[sl] {
			tried[sl] = true
			out = append(out, k)
		}
	}
	return out
}

// stateKey identifies the search state up to swapping keys of the same class.
func (s *orderSearch) stateKey() string {
	byClass := map[int][]int{}
	for k, p := range s.pos {
		byClass[s.class[k]] = append(byClass[s.class[k]], p)
	}
	classes := make([]int, 0, len(byClass))
	for cl := range byClass {
		classes = append(classes, cl)
	}
	sort.Ints(classes)
	var sb strings.Builder
	for _, cl := range classes {
		ps := byClass[cl]
		sort.Ints(ps)
		fmt.Fprintf(&sb, "%d:%v;", cl, ps)
	}
	return sb.String()
}

// stuckKey names the key whose order failed: at the furthest expected message that no key's next
// arrival fitted, the key it names, or else the first key that has it later in its arrivals.
func (s *orderSearch) stuckKey() (string, bool) {
	if s.stuck < 0 {
		return "", false
	}
	m := s.exp[s.stuck]
	if m.hasKey {
		return m.key, true
	}
	for k := range s.keys {
		for _, j := range s.seqs[k][s.stuckPos[k]:] {
			if m.matches(s.act[j]) {
				return s.keys[k], true
			}
		}
	}
	return "", false
}
