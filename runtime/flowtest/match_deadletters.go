package flowtest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/flowrun/flowrun/flow/testfile"
)

// CompareDeadLetters checks an expect_dead_letters block against the node's dead letters during
// the run and returns nil when it holds. Each expected dead letter must match a distinct actual one:
// its payload as a JSON value when given, its reason as a case-sensitive substring, its attempts
// when not zero. HasCount wants exactly Count dead letters.
func CompareDeadLetters(e *testfile.ExpectDeadLetters, actual []DeadLetter) *Failure {
	node := e.Node
	if e.NodeType != "" && !strings.HasPrefix(node, e.NodeType+".") {
		node = e.NodeType + "." + node
	}
	exp := make([]expectedDeadLetter, len(e.Messages))
	for i, m := range e.Messages {
		exp[i] = expectedDeadLetter{DeadLetter: m}
		if m.Payload != nil {
			exp[i].payload = parseValue(m.Payload)
		}
	}
	act := make([]actualDeadLetter, len(actual))
	for j, d := range actual {
		act[j] = actualDeadLetter{DeadLetter: d, payload: parseValue(d.Payload)}
	}
	pair, taken := matchDeadLetters(exp, act)

	var problems []string
	if e.HasCount && len(actual) != e.Count {
		problems = append(problems, fmt.Sprintf("expected %d dead %s, %d %s dead-lettered",
			e.Count, plural(e.Count, "letter", "letters"), len(actual), plural(len(actual), "message was", "messages were")))
	}
	unmatched := 0
	for _, j := range pair {
		if j < 0 {
			unmatched++
		}
	}
	if unmatched > 0 {
		problems = append(problems, fmt.Sprintf("%d of %d expected dead %s did not match any",
			unmatched, len(exp), plural(len(exp), "letter", "letters")))
	}
	if len(problems) == 0 {
		return nil
	}

	var lines []diffLine
	for i, x := range exp {
		if pair[i] >= 0 {
			lines = append(lines, diffLine{op: ' ', text: x.describe()})
			continue
		}
		l := diffLine{op: '-', text: x.describe()}
		if x.Range.Start.Line > 0 {
			l.text += fmt.Sprintf("  (line %d)", x.Range.Start.Line)
		}
		if note := closestDeadLetter(x, act, taken); note != "" {
			l.notes = append(l.notes, note)
		}
		lines = append(lines, l)
	}
	var sb strings.Builder
	if len(lines) > 0 {
		sb.WriteString("(- expected but not dead-lettered)\n")
		sb.WriteString(renderDiff(lines))
		sb.WriteString("\n")
	}
	sb.WriteString(deadLetterList(node, act))
	return &Failure{Range: e.Range, Summary: node + ": " + strings.Join(problems, "; "), Diff: sb.String()}
}

type expectedDeadLetter struct {
	testfile.DeadLetter
	payload value // when Payload != nil
}

type actualDeadLetter struct {
	DeadLetter
	payload value
}

// fits reports whether the actual dead letter d satisfies x.
func (x expectedDeadLetter) fits(d actualDeadLetter) bool {
	return (x.Payload == nil || x.payload.equal(d.payload)) &&
		strings.Contains(d.Reason, x.Reason) &&
		(x.Attempts == 0 || x.Attempts == d.Attempts)
}

func (x expectedDeadLetter) describe() string {
	var parts []string
	if x.Payload != nil {
		parts = append(parts, x.payload.canon)
	} else {
		parts = append(parts, "any payload")
	}
	if x.Reason != "" {
		parts = append(parts, "reason containing "+strconv.Quote(x.Reason))
	}
	if x.Attempts != 0 {
		parts = append(parts, fmt.Sprintf("%d %s", x.Attempts, plural(x.Attempts, "attempt", "attempts")))
	}
	return strings.Join(parts, ", ")
}

// matchDeadLetters pairs expectations with distinct dead letters, as many as can be. A greedy
// pairing can fail where a full one exists (reason "timeout" may take the only dead letter that
// also has the 3 attempts another expectation wants), so this finds a maximum bipartite matching
// by augmenting paths; the sizes are a test's handful.
func matchDeadLetters(exp []expectedDeadLetter, act []actualDeadLetter) (pair []int, taken []bool) {
	owner := make([]int, len(act)) // owner[j]: the expectation paired with act[j], or -1
	for j := range owner {
		owner[j] = -1
	}
	var augment func(i int, visited []bool) bool
	augment = func(i int, visited []bool) bool {
		for j := range act {
			if visited[j] || !exp[i].fits(act[j]) {
				continue
			}
			visited[j] = true
			if owner[j] < 0 || augment(owner[j], visited) {
				owner[j] = i
				return true
			}
		}
		return false
	}
	for i := range exp {
		augment(i, make([]bool, len(act)))
	}
	pair = make([]int, len(exp))
	for i := range pair {
		pair[i] = -1
	}
	taken = make([]bool, len(act))
	for j, i := range owner {
		if i >= 0 {
			pair[i] = j
			taken[j] = true
		}
	}
	return pair, taken
}

// closestDeadLetter describes how the free dead letter closest to x differs from it: the fewest
// differing payload fields, plus one for a reason or attempts that does not fit.
func closestDeadLetter(x expectedDeadLetter, act []actualDeadLetter, taken []bool) string {
	best, bestScore := -1, 0
	var bestNotes []string
	for j, d := range act {
		if taken[j] {
			continue
		}
		score := 0
		var notes []string
		if x.Payload != nil {
			if diffs := differences(x.payload, d.payload); len(diffs) > 0 {
				score += len(diffs)
				notes = append(notes, "payload: "+describeDiffs(diffs))
			}
		}
		if !strings.Contains(d.Reason, x.Reason) {
			score++
			notes = append(notes, fmt.Sprintf("reason %s does not contain %s", strconv.Quote(clip(d.Reason, 60)), strconv.Quote(x.Reason)))
		}
		if x.Attempts != 0 && x.Attempts != d.Attempts {
			score++
			notes = append(notes, fmt.Sprintf("attempts (expected %d, got %d)", x.Attempts, d.Attempts))
		}
		if best < 0 || score < bestScore {
			best, bestScore, bestNotes = j, score, notes
		}
	}
	if best < 0 {
		return ""
	}
	return "closest dead letter differs in: " + strings.Join(bestNotes, "; ")
}

// deadLetterList lists the node's dead letters, as the failure shows what did happen.
func deadLetterList(node string, act []actualDeadLetter) string {
	if len(act) == 0 {
		return node + " dead-lettered nothing"
	}
	const shown = 20
	var sb strings.Builder
	fmt.Fprintf(&sb, "dead letters of %s (%d):", node, len(act))
	for j, d := range act {
		if j == shown {
			fmt.Fprintf(&sb, "\n  ... %d more ...", len(act)-shown)
			break
		}
		sb.WriteString("\n  ")
		if d.Key != "" {
			sb.WriteString("key=" + keyText(d.Key) + " ")
		}
		fmt.Fprintf(&sb, "%s  reason %s  %d %s", d.payload.canon, strconv.Quote(d.Reason),
			d.Attempts, plural(d.Attempts, "attempt", "attempts"))
	}
	return sb.String()
}
