package flowtest

import (
	"container/heap"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Exact matching wants each key's messages in the order the expectation lists them; the order
// across keys is free, since partitions run concurrently. When the expectation gives keys, each
// expected message names its key and the check is direct. When it does not, the expected list
// must be split among the arrivals' keys so that each key's arrivals, in arrival order, are a
// subsequence of its part. Equal payloads under different keys (every order's "created" event)
// make the split ambiguous, and deciding it is NP-hard in general (it is recognizing a shuffle of
// many sequences), so checkOrder goes in three steps, each cheaper than the next and most runs
// decided by the first two:
//
//  1. Each key on its own must be a subsequence of the expected list. When one is not, that key's
//     order is wrong, whatever the split: a definite failure that names the key. One pass.
//  2. A greedy split: walking the expected list, give each message to a key whose next arrival it
//     is, choosing the key that needs it soonest (whose arrival after this one comes earliest in
//     the expected list). When it succeeds, the order holds. O(n log n).
//  3. A necessary condition that catches most failures of step 2 at once: each arrival has a
//     window of places it could take (after its key's earlier arrivals could be, before its later
//     ones could be), and the arrivals of each value must fit the places of that value in their
//     windows, one each. When they do not, no split exists and the key step 2 got stuck on is
//     named. O(n log n).
//  4. Otherwise a search over the splits, trying the other keys where the greedy one chose, with
//     states seen already skipped and keys with the same arrivals treated as one. It decides
//     unless it runs out of steps, and then says it could not.

// maxOrderSteps bounds step 4, in messages paired; past it the order is reported as uncertain.
const maxOrderSteps = 1 << 20

// checkOrder checks, once the messages are the expected ones, that each key's arrivals follow the
// expectation's order. It returns what is wrong and the diff, or "" when the order holds.
func (c *comparison) checkOrder() (problem, diff string) {
	ks := groupByKey(c.act)
	if k := firstMisorderedKey(c.exp, c.act, ks); k >= 0 {
		return c.orderProblem(ks.keys[k])
	}
	greedyOK, greedyStuck := greedyOrder(c.exp, c.act, ks)
	if greedyOK {
		return "", ""
	}
	if !windowsFit(c.exp, c.act, ks) && greedyStuck != "" {
		return c.orderProblem(greedyStuck)
	}
	s := newOrderSearch(c.exp, c.act, ks)
	if s.from(0) {
		return "", ""
	}
	if s.exhausted {
		msg := "the order of equal messages under different keys could not be checked in reasonable time; give the expected messages keys"
		if greedyStuck != "" {
			msg = fmt.Sprintf("the messages of key %s seem to have arrived in another order (%s)", strconv.Quote(greedyStuck),
				"equal messages under different keys leave it uncertain; give the expected messages keys")
			return msg, c.orderDiff(greedyStuck)
		}
		return msg, ""
	}
	if key, ok := s.stuckKey(); ok {
		return c.orderProblem(key)
	}
	return "the messages arrived in an order that no split of the expected list among their keys allows", ""
}

func (c *comparison) orderProblem(key string) (problem, diff string) {
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
	for _, l := range lines {
		if l.op != ' ' {
			return fmt.Sprintf("(the messages of key %s: - in the expected order, + in the order they arrived)\n", strconv.Quote(key)) +
				renderDiff(lines)
		}
	}
	// Paired as the diff pairs them, this key's order looks right: it is the split among the keys
	// that fails. Show what arrived.
	return "(each key's messages fit the expected order on their own, but not all at once)\n" + arrivalList(c.act)
}

// keySeqs are the arrivals grouped by key.
type keySeqs struct {
	keys  []string       // in order of first arrival
	seqs  [][]int        // seqs[k]: the arrivals of keys[k], indexes into the arrivals, in order
	index map[string]int // key → k
}

func groupByKey(act []message) *keySeqs {
	ks := &keySeqs{index: map[string]int{}}
	for j, a := range act {
		k, ok := ks.index[a.key]
		if !ok {
			k = len(ks.keys)
			ks.index[a.key] = k
			ks.keys = append(ks.keys, a.key)
			ks.seqs = append(ks.seqs, nil)
		}
		ks.seqs[k] = append(ks.seqs[k], j)
	}
	return ks
}

// A waiter is key k waiting, with pos arrivals paired, for the expected message equal to its next
// arrival; it is stale once the key has moved on.
type waiter struct{ k, pos int }

// firstMisorderedKey is step 1: the first key whose arrivals alone are not a subsequence of the
// expected messages it may take (those without a key and those with its key), or -1. Every key
// advances independently, greedily, which is exact for one sequence.
func firstMisorderedKey(exp, act []message, ks *keySeqs) int {
	pos := make([]int, len(ks.keys))
	waiting := map[string][]waiter{} // canonical value → the keys whose next arrival it is
	wait := func(k int) {
		if pos[k] < len(ks.seqs[k]) {
			v := act[ks.seqs[k][pos[k]]].val.canon
			waiting[v] = append(waiting[v], waiter{k, pos[k]})
		}
	}
	for k := range ks.keys {
		wait(k)
	}
	for _, m := range exp {
		if m.hasKey {
			k, ok := ks.index[m.key]
			if ok && pos[k] < len(ks.seqs[k]) && act[ks.seqs[k][pos[k]]].val.canon == m.val.canon {
				pos[k]++
				wait(k)
			}
			continue
		}
		ws := waiting[m.val.canon]
		delete(waiting, m.val.canon) // keys that wait for the same value again queue anew
		for _, w := range ws {
			if pos[w.k] == w.pos {
				pos[w.k]++
				wait(w.k)
			}
		}
	}
	for k := range ks.keys {
		if pos[k] < len(ks.seqs[k]) {
			return k
		}
	}
	return -1
}

// greedyOrder is step 2. It returns whether its split works and, when not, the key it got stuck
// on (see stuckKeyAt), for an uncertain report.
func greedyOrder(exp, act []message, ks *keySeqs) (ok bool, stuck string) {
	occurs := occurrences(exp)
	pos := make([]int, len(ks.keys))
	ready := map[string]*waitHeap{} // canonical value → the keys whose next arrival it is
	// wait queues key k under its next arrival, to be taken at a place after i.
	wait := func(k, i int) {
		seq := ks.seqs[k]
		if pos[k] == len(seq) {
			return
		}
		v := act[seq[pos[k]]].val.canon
		if ready[v] == nil {
			ready[v] = &waitHeap{}
		}
		heap.Push(ready[v], deadlined{waiter{k, pos[k]}, deadlineOf(occurs, act, seq, pos[k], i)})
	}
	for k := range ks.keys {
		wait(k, -1)
	}
	for i, m := range exp {
		k := -1
		if m.hasKey {
			if kk, found := ks.index[m.key]; found && pos[kk] < len(ks.seqs[kk]) &&
				act[ks.seqs[kk][pos[kk]]].val.canon == m.val.canon {
				k = kk // its entry in ready goes stale
			}
		} else if h := ready[m.val.canon]; h != nil {
			for h.Len() > 0 && k < 0 {
				w := heap.Pop(h).(deadlined)
				if pos[w.k] == w.pos {
					k = w.k
				}
			}
		}
		if k < 0 {
			return false, stuckKeyAt(m, act, ks, pos)
		}
		pos[k]++
		wait(k, i)
	}
	return true, ""
}

// windowsFit is step 3. It says nothing (true) when some expected message gives a key, as a place
// for one key is not a place for the others.
func windowsFit(exp, act []message, ks *keySeqs) bool {
	for _, m := range exp {
		if m.hasKey {
			return true
		}
	}
	occurs := occurrences(exp)
	type job struct{ first, last int } // the window of places an arrival could take
	jobs := map[string][]job{}         // by canonical value
	for _, seq := range ks.seqs {
		first := make([]int, len(seq))
		prev := -1
		for n, j := range seq {
			at := occurs[act[j].val.canon]
			i := sort.SearchInts(at, prev+1)
			if i == len(at) {
				return false
			}
			first[n], prev = at[i], at[i]
		}
		next := math.MaxInt
		for n := len(seq) - 1; n >= 0; n-- {
			v := act[seq[n]].val.canon
			at := occurs[v]
			i := sort.SearchInts(at, next) - 1 // the last place before next
			if i < 0 || at[i] < first[n] {
				return false
			}
			jobs[v] = append(jobs[v], job{first[n], at[i]})
			next = at[i]
		}
	}
	// Each value's places, in order, go to the waiting arrival whose window closes first: exact
	// for windows on one line of places.
	for v, js := range jobs {
		sort.Slice(js, func(a, b int) bool { return js[a].first < js[b].first })
		var closing intHeap
		n := 0
		for _, place := range occurs[v] {
			for n < len(js) && js[n].first <= place {
				heap.Push(&closing, js[n].last)
				n++
			}
			if closing.Len() == 0 {
				return false // a place no arrival can take: another went elsewhere, so one misses
			}
			if heap.Pop(&closing).(int) < place {
				return false
			}
		}
	}
	return true
}

type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// occurrences maps each canonical value to its indexes in the expected list.
func occurrences(exp []message) map[string][]int {
	occurs := map[string][]int{}
	for i, m := range exp {
		occurs[m.val.canon] = append(occurs[m.val.canon], i)
	}
	return occurs
}

// deadlineOf is how soon a key needs its next arrival, seq[p], paired, when that takes a place
// after i: the first place in the expected list where the arrival after it could go. A key with
// nothing after can wait the longest.
func deadlineOf(occurs map[string][]int, act []message, seq []int, p, i int) int {
	if p+1 == len(seq) {
		return math.MaxInt
	}
	at := occurs[act[seq[p+1]].val.canon]
	if n := sort.SearchInts(at, i+2); n < len(at) {
		return at[n]
	}
	return math.MaxInt
}

type deadlined struct {
	waiter
	deadline int
}

// waitHeap orders waiting keys by deadline, then by first arrival.
type waitHeap []deadlined

func (h waitHeap) Len() int { return len(h) }
func (h waitHeap) Less(i, j int) bool {
	if h[i].deadline != h[j].deadline {
		return h[i].deadline < h[j].deadline
	}
	return h[i].k < h[j].k
}
func (h waitHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *waitHeap) Push(x any)   { *h = append(*h, x.(deadlined)) }
func (h *waitHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// stuckKeyAt names the key to blame when no key's next arrival fits the expected message m, with
// pos the arrivals paired so far: the key m names, or else the first key that has m later.
func stuckKeyAt(m message, act []message, ks *keySeqs, pos []int) string {
	if m.hasKey {
		return m.key
	}
	for k, seq := range ks.seqs {
		for _, j := range seq[pos[k]:] {
			if m.matches(act[j]) {
				return ks.keys[k]
			}
		}
	}
	return ""
}

// orderSearch is step 4's state.
type orderSearch struct {
	exp, act []message
	ks       *keySeqs
	occurs   map[string][]int // canonical value → its indexes in the expected list
	class    []int            // class[k]: the first key whose arrivals are the same values as keys[k]'s
	pos      []int            // pos[k]: how many of keys[k]'s arrivals are paired so far
	heads    map[string][]int // canonical value → the keys whose next arrival it is, ascending

	// state identifies pos up to swapping keys of a class: the sum over keys of a hash of
	// (class, pos), 128 bits so that two states that differ do not collide in practice.
	state     [2]uint64
	seen      map[[2]uint64]bool // states at a choice already tried
	steps     int
	exhausted bool
	stuck     int   // the furthest expected message that no key's next arrival fitted; -1: none
	stuckPos  []int // pos then
}

func newOrderSearch(exp, act []message, ks *keySeqs) *orderSearch {
	s := &orderSearch{exp: exp, act: act, ks: ks, occurs: occurrences(exp), heads: map[string][]int{},
		seen: map[[2]uint64]bool{}, stuck: -1}
	s.pos = make([]int, len(ks.keys))
	s.class = make([]int, len(ks.keys))
	classOf := map[string]int{}
	for k, seq := range ks.seqs {
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
		s.hashIn(k, 1)
	}
	return s
}

// hashIn adds (sign 1) or removes (sign -1) key k's part of the state.
func (s *orderSearch) hashIn(k int, sign uint64) {
	x := uint64(s.class[k])<<32 | uint64(s.pos[k])
	s.state[0] += sign * mix(x^0x9e3779b97f4a7c15)
	s.state[1] += sign * mix(x^0xd1b54a32d192ed03)
}

// mix is splitmix64's finalizer: a well-spread 64-bit hash of x.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// head is the canonical value of keys[k]'s next arrival.
func (s *orderSearch) head(k int) (string, bool) {
	if s.pos[k] == len(s.ks.seqs[k]) {
		return "", false
	}
	return s.act[s.ks.seqs[k][s.pos[k]]].val.canon, true
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
func (s *orderSearch) advance(k int) { s.move(k, 1); s.steps++ }
func (s *orderSearch) retreat(k int) { s.move(k, -1) }

func (s *orderSearch) move(k, by int) {
	s.removeHead(k)
	s.hashIn(k, ^uint64(0)) // −1
	s.pos[k] += by
	s.hashIn(k, 1)
	s.addHead(k)
}

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
		if s.steps >= maxOrderSteps {
			s.exhausted = true
			undo()
			return false
		}
		cands := s.candidates(i)
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
		if s.seen[s.state] {
			undo()
			return false
		}
		s.seen[s.state] = true
		for _, k := range cands {
			s.advance(k)
			if s.from(i + 1) {
				return true
			}
			s.retreat(k)
			if s.exhausted {
				break
			}
		}
		undo()
		return false
	}
}

// candidates are the keys whose next arrival satisfies expected message i, one per class and
// position (keys with the same values at the same point are interchangeable), the one that needs
// it soonest first, as in step 2.
func (s *orderSearch) candidates(i int) []int {
	m := s.exp[i]
	if m.hasKey {
		if k, ok := s.ks.index[m.key]; ok {
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
	var out []deadlined
	for _, k := range h {
		if sl := (slot{s.class[k], s.pos[k]}); !tried[sl] {
			tried[sl] = true
			out = append(out, deadlined{waiter{k, s.pos[k]}, deadlineOf(s.occurs, s.act, s.ks.seqs[k], s.pos[k], i-1)})
		}
	}
	sort.Slice(out, func(a, b int) bool { return waitHeap(out).Less(a, b) })
	keys := make([]int, len(out))
	for n, d := range out {
		keys[n] = d.k
	}
	return keys
}

// stuckKey names the key whose order failed, at the furthest expected message that no key's next
// arrival fitted.
func (s *orderSearch) stuckKey() (string, bool) {
	if s.stuck < 0 {
		return "", false
	}
	key := stuckKeyAt(s.exp[s.stuck], s.act, s.ks, s.stuckPos)
	return key, key != ""
}
