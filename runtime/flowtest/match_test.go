package flowtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow/testfile"
	"github.com/hashicorp/hcl/v2"
)

// msg is an expected message without a key; kmsg one with a key.
func msg(payload string) testfile.Message { return testfile.Message{Payload: []byte(payload)} }
func kmsg(key, payload string) testfile.Message {
	return testfile.Message{Payload: []byte(payload), Key: key, HasKey: true}
}

// arr is an arrival at sink.out.
func arr(key, payload string) Arrived {
	return Arrived{Key: key, Payload: []byte(payload), Where: "sink.out"}
}

var expectRange = hcl.Range{Filename: "t.flowtest.hcl", Start: hcl.Pos{Line: 7, Column: 3}, End: hcl.Pos{Line: 7, Column: 9}}

func expect(match string, msgs ...testfile.Message) *testfile.Expect {
	return &testfile.Expect{Sink: "out", Messages: msgs, HasMessages: true, Match: match, Range: expectRange}
}

func TestCompareMessages(t *testing.T) {
	tests := []struct {
		name    string
		expect  *testfile.Expect
		actual  []Arrived
		summary string // "" when the expectation holds
		diff    []string
	}{
		{
			name:   "exact, same order",
			expect: expect("", msg(`{"id":1}`), msg(`{"id":2}`)),
			actual: []Arrived{arr("a", `{"id":1}`), arr("a", `{"id":2}`)},
		},
		{
			name:   "values not bytes: key order, 1 and 1.0, exponents",
			expect: expect("", msg(`{"a":1,"b":2,"c":[1.5e1, 0.10]}`)),
			actual: []Arrived{arr("", `{"b":2.0, "c":[15,0.1],"a":1}`)},
		},
		{
			name:    "large integers keep every digit",
			expect:  expect("", msg(`{"n":12345678901234567890}`)),
			actual:  []Arrived{arr("", `{"n":12345678901234567891}`)},
			summary: "sink.out: 1 of 1 expected message did not arrive; 1 unexpected arrived",
			diff: []string{
				`- {"n":12345678901234567890}`,
				`    closest arrival differs in: n (expected 12345678901234567890, got 12345678901234567891)`,
				`+ {"n":12345678901234567891}`,
			},
		},
		{
			name:   "large integers equal in other spellings",
			expect: expect("", msg(`{"n":12345678901234567890}`)),
			actual: []Arrived{arr("", `{"n":1234567890123456789.0e1}`)},
		},
		{
			name:    "a number is not a string",
			expect:  expect("", msg(`{"n":1}`)),
			actual:  []Arrived{arr("", `{"n":"1"}`)},
			summary: "sink.out: 1 of 1 expected message did not arrive; 1 unexpected arrived",
			diff:    []string{`closest arrival differs in: n (expected 1, got "1")`},
		},
		{
			name:    "exact, missing and unexpected with closest",
			expect:  expect("", msg(`{"id":1,"amount":5,"currency":"EUR"}`), msg(`{"id":2}`), msg(`{"id":3}`)),
			actual:  []Arrived{arr("a", `{"id":1,"amount":6}`), arr("a", `{"id":2}`)},
			summary: "sink.out: 2 of 3 expected messages did not arrive; 1 unexpected arrived",
			diff: []string{
				`(- expected but did not arrive, + arrived but not expected)`,
				`- {"amount":5,"currency":"EUR","id":1}`,
				`    closest arrival differs in: amount (expected 5, got 6); missing: currency`,
				`  {"id":2}`,
				`- {"id":3}`,
				`+ {"amount":6,"id":1}`,
			},
		},
		{
			name:    "exact, only unexpected",
			expect:  expect("", msg(`{"id":1}`)),
			actual:  []Arrived{arr("a", `{"id":1}`), arr("a", `{"id":9}`)},
			summary: "sink.out: 1 unexpected message arrived",
			diff:    []string{`  {"id":1}`, `+ {"id":9}`},
		},
		{
			name:    "exact, expecting none",
			expect:  expect(""),
			actual:  []Arrived{arr("a", `{"id":9}`)},
			summary: "sink.out: 1 unexpected message arrived",
		},
		{
			name:   "exact, order across keys is free",
			expect: expect("", msg(`{"id":1}`), msg(`{"id":2}`), msg(`{"id":3}`)),
			actual: []Arrived{arr("b", `{"id":2}`), arr("a", `{"id":1}`), arr("a", `{"id":3}`)},
		},
		{
			name:    "exact, order within a key is not",
			expect:  expect("", msg(`{"id":1}`), msg(`{"id":2}`), msg(`{"id":3}`)),
			actual:  []Arrived{arr("c1", `{"id":1}`), arr("c1", `{"id":3}`), arr("c1", `{"id":2}`)},
			summary: `sink.out: the messages of key "c1" arrived in another order`,
			diff: []string{
				`(the messages of key "c1": - in the expected order, + in the order they arrived)`,
				`  key=c1 {"id":1}`,
				`- key=c1 {"id":2}`,
				`  key=c1 {"id":3}`,
				`+ key=c1 {"id":2}`,
			},
		},
		{
			name:    "unordered accepts any order",
			expect:  expect(testfile.MatchUnordered, msg(`{"id":1}`), msg(`{"id":2}`), msg(`{"id":3}`)),
			actual:  []Arrived{arr("c1", `{"id":3}`), arr("c1", `{"id":2}`), arr("c1", `{"id":1}`)},
			summary: "",
		},
		{
			name:    "unordered counts duplicates",
			expect:  expect(testfile.MatchUnordered, msg(`{"id":1}`), msg(`{"id":1}`)),
			actual:  []Arrived{arr("c1", `{"id":1}`)},
			summary: "sink.out: 1 of 2 expected messages did not arrive",
		},
		{
			name:   "subset allows others",
			expect: expect(testfile.MatchSubset, msg(`{"id":2}`)),
			actual: []Arrived{arr("c1", `{"id":1}`), arr("c1", `{"id":2}`), arr("c1", `{"id":3}`)},
		},
		{
			name:    "subset counts duplicates",
			expect:  expect(testfile.MatchSubset, msg(`{"id":2}`), msg(`{"id":2}`)),
			actual:  []Arrived{arr("c1", `{"id":1}`), arr("c1", `{"id":2}`)},
			summary: "sink.out: 1 of 2 expected messages did not arrive",
			diff:    []string{`  {"id":2}`, `- {"id":2}`, `closest arrival differs in: id (expected 2, got 1)`, `+ {"id":1}`},
		},
		{
			name:   "a key must match when given",
			expect: expect("", kmsg("c1", `{"id":1}`), kmsg("c2", `{"id":1}`)),
			actual: []Arrived{arr("c2", `{"id":1}`), arr("c1", `{"id":1}`)},
		},
		{
			name:    "a wrong key fails and is named",
			expect:  expect("", kmsg("c1", `{"id":1}`)),
			actual:  []Arrived{arr("c2", `{"id":1}`)},
			summary: "sink.out: 1 of 1 expected message did not arrive; 1 unexpected arrived",
			diff: []string{
				`- key=c1 {"id":1}`,
				`    closest arrival differs in: the key (expected "c1", got "c2")`,
				`+ key=c2 {"id":1}`,
			},
		},
		{
			name:    "unordered: a key must match when given",
			expect:  expect(testfile.MatchUnordered, kmsg("c1", `{"id":1}`), kmsg("c2", `{"id":2}`)),
			actual:  []Arrived{arr("c2", `{"id":1}`), arr("c2", `{"id":2}`)},
			summary: "sink.out: 1 of 2 expected messages did not arrive; 1 unexpected arrived",
			diff: []string{
				`- key=c1 {"id":1}`,
				`    closest arrival differs in: the key (expected "c1", got "c2")`,
				`+ key=c2 {"id":1}`,
			},
		},
		{
			name: "keyed expectations are paired before keyless ones",
			// Greedy in written order would give the keyless one c1's message and leave the keyed
			// one without.
			expect: expect(testfile.MatchUnordered, msg(`{"id":1}`), kmsg("c1", `{"id":1}`)),
			actual: []Arrived{arr("c1", `{"id":1}`), arr("c2", `{"id":1}`)},
		},
		{
			name:    "keyed, order within a key",
			expect:  expect("", kmsg("c1", `{"id":1}`), kmsg("c2", `{"id":2}`), kmsg("c1", `{"id":3}`)),
			actual:  []Arrived{arr("c2", `{"id":2}`), arr("c1", `{"id":3}`), arr("c1", `{"id":1}`)},
			summary: `sink.out: the messages of key "c1" arrived in another order`,
		},
		{
			name: "identical payloads under different keys, keyless expectation",
			// c1 sent A then B, c2 sent A: the expected A, B, A splits as c1 = A B, c2 = A; a
			// checker that gave the first expected A to c2 would wrongly fail.
			expect: expect("", msg(`"A"`), msg(`"B"`), msg(`"A"`)),
			actual: []Arrived{arr("c2", `"A"`), arr("c1", `"A"`), arr("c1", `"B"`)},
		},
		{
			name: "identical payloads, the first A is c2's",
			// Both keys start with A; only giving the first expected A to c2 lets c2's C follow.
			expect: expect("", msg(`"A"`), msg(`"C"`), msg(`"A"`), msg(`"B"`)),
			actual: []Arrived{arr("c1", `"A"`), arr("c1", `"B"`), arr("c2", `"A"`), arr("c2", `"C"`)},
		},
		{
			name:    "identical payloads, no split fits",
			expect:  expect("", msg(`"A"`), msg(`"B"`), msg(`"A"`)),
			actual:  []Arrived{arr("c1", `"B"`), arr("c1", `"A"`), arr("c1", `"A"`)},
			summary: `sink.out: the messages of key "c1" arrived in another order`,
		},
		{
			name: "each key fits alone but not together",
			// c1 = A B and c2 = B A: each is a subsequence of A B A... but the expected A B has only
			// two messages and four arrived — so the multiset fails first. With A B B A expected,
			// c1 takes A B and c2 takes B A: fine. Expected B A A B: c1 (A B) takes A then B, c2 (B A)
			// takes B then A: fine too. Expected A A B B: c2's A must precede its B: no split.
			expect:  expect("", msg(`"A"`), msg(`"A"`), msg(`"B"`), msg(`"B"`)),
			actual:  []Arrived{arr("c1", `"A"`), arr("c1", `"B"`), arr("c2", `"B"`), arr("c2", `"A"`)},
			summary: `sink.out: the messages of key "c2" arrived in another order`,
		},
		{
			name: "many keys with the same messages",
			// 30 keys that each sent A then B, expected as 30 As then 30 Bs: without treating the
			// keys as interchangeable the search would try 30! orders.
			expect: expect("", append(repeat(msg(`"A"`), 30), repeat(msg(`"B"`), 30)...)...),
			actual: manyKeys(30, `"A"`, `"B"`),
		},
		{
			name:    "count only",
			expect:  &testfile.Expect{Sink: "out", Count: 3, HasCount: true, Range: expectRange},
			actual:  []Arrived{arr("", `1`), arr("", `2`)},
			summary: "sink.out: expected 3 messages, 2 arrived",
			diff:    []string{"arrived (2):", "  1", "  2"},
		},
		{
			name:   "count holds",
			expect: &testfile.Expect{Topic: "scored", Count: 2, HasCount: true},
			actual: []Arrived{arr("", `1`), arr("", `2`)},
		},
		{
			name: "count and subset: both must hold",
			expect: &testfile.Expect{Sink: "out", Messages: []testfile.Message{msg(`1`)}, HasMessages: true,
				Match: testfile.MatchSubset, Count: 1, HasCount: true},
			actual:  []Arrived{arr("", `1`), arr("", `2`)},
			summary: "sink.out: expected 1 message, 2 arrived",
			diff:    []string{"  1", "+ 2"},
		},
		{
			name:    "topic",
			expect:  &testfile.Expect{Topic: "scored", Messages: []testfile.Message{msg(`1`)}, HasMessages: true},
			actual:  nil,
			summary: "topic.scored: 1 of 1 expected message did not arrive",
		},
		{
			name:    "invalid JSON arrival compares as bytes",
			expect:  expect("", msg(`{"a":1}`)),
			actual:  []Arrived{arr("", `{"a":1`)},
			summary: "sink.out: 1 of 1 expected message did not arrive; 1 unexpected arrived",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := CompareMessages(tt.expect, tt.actual)
			if tt.summary == "" {
				if f != nil {
					t.Fatalf("failed: %s\n%s", f.Summary, f.Diff)
				}
				return
			}
			if f == nil {
				t.Fatalf("held, want %q", tt.summary)
			}
			if f.Summary != tt.summary {
				t.Errorf("summary\n got %q\nwant %q\n%s", f.Summary, tt.summary, f.Diff)
			}
			if f.Range != tt.expect.Range {
				t.Errorf("range %v, want the expect block's", f.Range)
			}
			checkLines(t, f.Diff, tt.diff)
		})
	}
}

// checkLines checks that want appear in text as lines, in order; a wanted line that starts with a
// letter (a note) may be indented.
func checkLines(t *testing.T, text string, want []string) {
	t.Helper()
	lines := strings.Split(text, "\n")
	at := 0
	for _, w := range want {
		found := false
		for at < len(lines) && !found {
			found = lines[at] == w || strings.TrimSpace(lines[at]) == w
			at++
		}
		if !found {
			t.Errorf("no line %q (in order) in\n%s", w, text)
			return
		}
	}
}

func repeat(m testfile.Message, n int) []testfile.Message {
	out := make([]testfile.Message, n)
	for i := range out {
		out[i] = m
	}
	return out
}

func manyKeys(n int, payloads ...string) []Arrived {
	var out []Arrived
	for k := 0; k < n; k++ {
		for _, p := range payloads {
			out = append(out, arr(fmt.Sprintf("k%d", k), p))
		}
	}
	return out
}

func TestDiffElidesLongMatchingRuns(t *testing.T) {
	var want []testfile.Message
	var got []Arrived
	for i := 0; i < 50; i++ {
		want = append(want, msg(fmt.Sprintf(`{"id":%d}`, i)))
		if i != 45 {
			got = append(got, arr("a", fmt.Sprintf(`{"id":%d}`, i)))
		}
	}
	f := CompareMessages(expect("", want...), got)
	if f == nil {
		t.Fatal("held")
	}
	checkLines(t, f.Diff, []string{
		`(- expected but did not arrive, + arrived but not expected)`,
		`  ... 42 matching messages ...`,
		`  {"id":42}`, `  {"id":43}`, `  {"id":44}`,
		`- {"id":45}`,
		`  {"id":46}`, `  {"id":47}`, `  {"id":48}`, `  {"id":49}`,
	})
	if strings.Contains(f.Diff, `{"id":20}`) {
		t.Errorf("a long run of matches is not elided:\n%s", f.Diff)
	}
}

func TestDiffShowsMessageLines(t *testing.T) {
	m := msg(`{"id":1}`)
	m.Range = hcl.Range{Filename: "golden/out.jsonl", Start: hcl.Pos{Line: 3}}
	m2 := msg(`{"id":2}`)
	m2.Range = hcl.Range{Filename: expectRange.Filename, Start: hcl.Pos{Line: 12}}
	f := CompareMessages(expect("", m, m2), nil)
	checkLines(t, f.Diff, []string{`- {"id":1}  (golden/out.jsonl:3)`, `- {"id":2}  (line 12)`})
}

func TestCanonicalNumber(t *testing.T) {
	tests := map[string]string{
		"0": "0", "-0": "0", "0.000": "0", "1": "1", "1.0": "1", "1e0": "1", "10": "10", "1e1": "10",
		"100E-2": "1", "0.1": "0.1", "1.50": "1.5", "-2.5e-3": "-0.0025", "1e20": "100000000000000000000", "1e21": "1e21",
		"1e22": "1e22", "1.5e-7": "1.5e-7", "123.456e2": "12345.6",
		"12345678901234567890": "12345678901234567890", "12345678901234567891": "12345678901234567891",
		"1e999999999999": "1e999999999999",
	}
	for in, want := range tests {
		if got := canonicalNumber(in); got != want {
			t.Errorf("canonicalNumber(%s) = %s, want %s", in, got, want)
		}
	}
}

var dlRange = hcl.Range{Filename: "t.flowtest.hcl", Start: hcl.Pos{Line: 20, Column: 3}}

func TestCompareDeadLetters(t *testing.T) {
	timeout := DeadLetter{Node: "stage.score", Key: "c1", Payload: []byte(`{"id":1}`), Reason: "scoring service timeout", Attempts: 3}
	bad := DeadLetter{Node: "stage.score", Key: "c2", Payload: []byte(`{"id":2}`), Reason: "bad input", Attempts: 1}
	tests := []struct {
		name    string
		expect  testfile.ExpectDeadLetters
		actual  []DeadLetter
		summary string
		diff    []string
	}{
		{
			name:   "count",
			expect: testfile.ExpectDeadLetters{Count: 2, HasCount: true},
			actual: []DeadLetter{timeout, bad},
		},
		{
			name:    "count fails and lists them",
			expect:  testfile.ExpectDeadLetters{Count: 0, HasCount: true},
			actual:  []DeadLetter{timeout},
			summary: "stage.score: expected 0 dead letters, 1 message was dead-lettered",
			diff:    []string{"dead letters of stage.score (1):", `  key=c1 {"id":1}  reason "scoring service timeout"  3 attempts`},
		},
		{
			name: "payload as value, reason substring, attempts",
			expect: testfile.ExpectDeadLetters{Messages: []testfile.DeadLetter{
				{Payload: []byte(`{ "id" : 1.0 }`), Reason: "timeout", Attempts: 3},
				{Reason: "bad"},
			}},
			actual: []DeadLetter{bad, timeout},
		},
		{
			name:    "reason is case-sensitive",
			expect:  testfile.ExpectDeadLetters{Messages: []testfile.DeadLetter{{Reason: "Timeout"}}},
			actual:  []DeadLetter{timeout},
			summary: "stage.score: 1 of 1 expected dead letter did not match any",
			diff:    []string{`- any payload, reason containing "Timeout"`, `closest dead letter differs in: reason "scoring service timeout" does not contain "Timeout"`},
		},
		{
			name:    "each expectation needs its own dead letter",
			expect:  testfile.ExpectDeadLetters{Messages: []testfile.DeadLetter{{Reason: "timeout"}, {Reason: "timeout"}}},
			actual:  []DeadLetter{timeout, bad},
			summary: "stage.score: 1 of 2 expected dead letters did not match any",
		},
		{
			name: "pairing is not greedy",
			// The first expectation fits both; taken greedily it would take the only one the second fits.
			expect: testfile.ExpectDeadLetters{Messages: []testfile.DeadLetter{{Reason: "timeout"}, {Reason: "timeout", Attempts: 3}}},
			actual: []DeadLetter{timeout, {Node: "stage.score", Payload: []byte(`{}`), Reason: "timeout", Attempts: 1}},
		},
		{
			name: "closest shows the payload difference and attempts",
			expect: testfile.ExpectDeadLetters{Messages: []testfile.DeadLetter{
				{Payload: []byte(`{"id":1,"amount":5}`), Attempts: 5, Range: dlRange},
			}},
			actual:  []DeadLetter{bad, {Node: "stage.score", Payload: []byte(`{"id":1,"amount":6}`), Reason: "x", Attempts: 3}},
			summary: "stage.score: 1 of 1 expected dead letter did not match any",
			diff: []string{
				`- {"amount":5,"id":1}, 5 attempts  (line 20)`,
				`    closest dead letter differs in: payload: amount (expected 5, got 6); attempts (expected 5, got 3)`,
				"dead letters of stage.score (2):",
			},
		},
		{
			name:    "none arrived",
			expect:  testfile.ExpectDeadLetters{Messages: []testfile.DeadLetter{{Reason: "x"}}},
			summary: "stage.score: 1 of 1 expected dead letter did not match any",
			diff:    []string{"stage.score dead-lettered nothing"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := tt.expect
			e.NodeType, e.Node = "stage", "score"
			f := CompareDeadLetters(&e, tt.actual)
			if tt.summary == "" {
				if f != nil {
					t.Fatalf("failed: %s\n%s", f.Summary, f.Diff)
				}
				return
			}
			if f == nil {
				t.Fatalf("held, want %q", tt.summary)
			}
			if f.Summary != tt.summary {
				t.Errorf("summary\n got %q\nwant %q\n%s", f.Summary, tt.summary, f.Diff)
			}
			checkLines(t, f.Diff, tt.diff)
		})
	}
}

func TestDiffStopsAfterManyChanges(t *testing.T) {
	e := expect("")
	var got []Arrived
	for i := 0; i < 500; i++ {
		e.Messages = append(e.Messages, msg(fmt.Sprint(i)))
		got = append(got, arr("a", fmt.Sprint(499-i)))
	}
	f := CompareMessages(e, got)
	if f == nil || f.Summary != `sink.out: the messages of key "a" arrived in another order` {
		t.Fatalf("got %+v", f)
	}
	if n := strings.Count(f.Diff, "\n"); n > maxChangedLines+10 {
		t.Errorf("the diff has %d lines", n)
	}
	if !strings.Contains(f.Diff, "more differing messages") {
		t.Errorf("no note of what was left out:\n%s", f.Diff)
	}
}
