package flowtest

import (
	"fmt"
	"strings"
	"testing"
)

// bruteOrder decides by trying every split whether the arrivals, by key, can be paired with the
// expected messages from i on in order: the definition that checkOrder implements faster.
func bruteOrder(exp, act []message, ks *keySeqs, pos []int, i int) bool {
	if i == len(exp) {
		return true
	}
	for k := range ks.keys {
		if pos[k] < len(ks.seqs[k]) && exp[i].matches(act[ks.seqs[k][pos[k]]]) {
			pos[k]++
			ok := bruteOrder(exp, act, ks, pos, i+1)
			pos[k]--
			if ok {
				return true
			}
		}
	}
	return false
}

// TestCheckOrderAgreesWithBruteForce runs checkOrder on every small case of keys whose arrivals
// are equal payloads (A, B, C) and every order of the expected list, against bruteOrder. These are
// the ambiguous cases: which key an expected "A" belongs to is the question.
func TestCheckOrderAgreesWithBruteForce(t *testing.T) {
	var seqs []string
	var gen func(string)
	gen = func(s string) {
		if s != "" {
			seqs = append(seqs, s)
		}
		if len(s) < 3 {
			gen(s + "A")
			gen(s + "B")
		}
	}
	gen("")
	checked, failing := 0, 0
	for _, s1 := range seqs {
		for _, s2 := range seqs {
			for _, s3 := range []string{"", "A", "AB", "C"} {
				if len(s1)+len(s2)+len(s3) > 6 {
					continue
				}
				var act []message
				for k, s := range []string{s1, s2, s3} {
					for _, ch := range s {
						act = append(act, message{key: fmt.Sprint("k", k), hasKey: true, val: parseValue([]byte(`"` + string(ch) + `"`))})
					}
				}
				for _, order := range permutations(s1 + s2 + s3) {
					var exp []message
					for _, ch := range order {
						exp = append(exp, message{val: parseValue([]byte(`"` + string(ch) + `"`))})
					}
					ks := groupByKey(act)
					want := bruteOrder(exp, act, ks, make([]int, len(ks.keys)), 0)
					c := &comparison{exp: exp, act: act, mode: "exact"}
					c.pair, c.taken = matchMultiset(exp, act)
					problem, _ := c.checkOrder()
					if (problem == "") != want {
						t.Fatalf("keys %q %q %q, expected %s: a split exists: %v; checkOrder says %q", s1, s2, s3, order, want, problem)
					}
					checked++
					if !want {
						failing++
					}
				}
			}
		}
	}
	if checked < 5000 || failing == 0 || failing == checked {
		t.Errorf("checked %d cases, %d failing: the enumeration is not doing its job", checked, failing)
	}
}

// permutations lists the distinct orders of s's letters.
func permutations(s string) []string {
	seen := map[string]bool{}
	var out []string
	var perm func(pre, rest string)
	perm = func(pre, rest string) {
		if rest == "" {
			if !seen[pre] {
				seen[pre] = true
				out = append(out, pre)
			}
			return
		}
		for i := range rest {
			perm(pre+rest[i:i+1], rest[:i]+rest[i+1:])
		}
	}
	perm("", s)
	return out
}

// arrivals makes arrivals from "key:payload" words, in order.
func arrivals(spec string) []Arrived {
	var out []Arrived
	for _, w := range strings.Fields(spec) {
		k, p, _ := strings.Cut(w, ":")
		out = append(out, arr(k, p))
	}
	return out
}

func TestCheckOrderSteps(t *testing.T) {
	tests := []struct {
		name     string
		expected string // payloads, in order, without keys
		actual   string
		summary  string
		diff     []string
	}{
		{
			// Step 2 gives the first A to k0 (its next A comes soonest) and gets stuck; only the
			// search (step 4) finds k1 A, k1 A, k1 B, k0 A, k0 A.
			name: "the search finds a split the greedy one missed", expected: `"A" "A" "B" "A" "A"`,
			actual: `k0:"A" k0:"A" k1:"A" k1:"A" k1:"B"`,
		},
		{
			// Neither step 1 nor step 3 sees it: the search must try the splits to refute it.
			name: "the search proves there is no split", expected: `"A" "B" "B" "A" "A" "B"`,
			actual:  `k0:"A" k0:"B" k1:"A" k1:"B" k2:"A" k2:"B"`,
			summary: `sink.out: the messages of key "k1" arrived in another order`,
		},
		{
			name: "each key fits alone, not together", expected: `"B" "A" "A" "A" "A" "B"`,
			// k1 and k2 both need an A before their B; the first B has none before it.
			actual:  `k0:"A" k1:"A" k1:"A" k1:"B" k2:"A" k2:"B"`,
			summary: `sink.out: the messages of key "k1" arrived in another order`,
		},
		{
			name: "one key out of order", expected: `"A" "B" "C"`,
			actual:  `k1:"C" k2:"A" k1:"B"`,
			summary: `sink.out: the messages of key "k1" arrived in another order`,
			diff:    []string{`(the messages of key "k1": - in the expected order, + in the order they arrived)`, `- key=k1 "B"`, `  key=k1 "C"`, `+ key=k1 "B"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := expect("")
			for _, p := range strings.Fields(tt.expected) {
				e.Messages = append(e.Messages, msg(p))
			}
			f := CompareMessages(e, arrivals(tt.actual))
			switch {
			case tt.summary == "" && f != nil:
				t.Fatalf("failed: %s\n%s", f.Summary, f.Diff)
			case tt.summary != "" && f == nil:
				t.Fatalf("held, want %q", tt.summary)
			case f != nil:
				if f.Summary != tt.summary {
					t.Errorf("summary %q, want %q", f.Summary, tt.summary)
				}
				checkLines(t, f.Diff, tt.diff)
			}
		})
	}
}

// TestCheckOrderLargeIsFast: 5000 orders that each arrived as "created" then their own "paid",
// expected in the reverse order of the keys. Every expected "created" could be any order's; a
// search that tried them in turn would take minutes.
func TestCheckOrderLargeIsFast(t *testing.T) {
	const orders = 5000
	var act []Arrived
	e := expect("")
	for k := 0; k < orders; k++ {
		act = append(act, arr(fmt.Sprint(k), `{"status":"created"}`), arr(fmt.Sprint(k), fmt.Sprintf(`{"id":%d,"status":"paid"}`, k)))
		e.Messages = append(e.Messages, msg(`{"status":"created"}`), msg(fmt.Sprintf(`{"id":%d,"status":"paid"}`, orders-1-k)))
	}
	if f := CompareMessages(e, act); f != nil {
		t.Fatalf("failed: %s", f.Summary)
	}
	// Swap two of one order's messages: now key 7 is out of order.
	i := 2 * (orders - 1 - 7)
	e.Messages[i], e.Messages[i+1] = e.Messages[i+1], e.Messages[i]
	f := CompareMessages(e, act)
	if f == nil || f.Summary != `sink.out: the messages of key "7" arrived in another order` {
		t.Fatalf("got %+v", f)
	}
}

// TestCheckOrderSearchRemembersStates: 30 blocks, each with its own payloads, that can be split
// two ways (x takes the first A and y the second, or the other way round) ending in the same
// state, then a block that no split fits but that only the search refutes. A search that did not
// remember the states it refuted would try 2^30 combinations of the first blocks, and give up.
func TestCheckOrderSearchRemembersStates(t *testing.T) {
	e := expect("")
	var act []Arrived
	add := func(expected, actual string) {
		for _, p := range strings.Fields(expected) {
			e.Messages = append(e.Messages, msg(p))
		}
		act = append(act, arrivals(actual)...)
	}
	for b := 0; b < 30; b++ {
		a, bb, c := fmt.Sprintf(`"A%d"`, b), fmt.Sprintf(`"B%d"`, b), fmt.Sprintf(`"C%d"`, b)
		x, y := fmt.Sprintf("x%d:", b), fmt.Sprintf("y%d:", b)
		add(strings.Join([]string{a, a, bb, c}, " "), x+a+" "+x+bb+" "+y+a+" "+y+c)
	}
	add(`"A" "B" "B" "A" "A" "B"`, `k0:"A" k0:"B" k1:"A" k1:"B" k2:"A" k2:"B"`)
	f := CompareMessages(e, act)
	if f == nil || f.Summary != `sink.out: the messages of key "k1" arrived in another order` {
		t.Fatalf("got %+v", f)
	}
}
