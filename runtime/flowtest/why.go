package flowtest

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow/testfile"
)

// maxTraced bounds how many missing messages Explain follows one by one.
const maxTraced = 5

// equalScore is the similarity of equal values, above any count of shared fields.
const equalScore = 1 << 30

// Explain appends to f.Why what the run's facts say happened to the messages an expectation
// missed: for each expected message that did not arrive, the sent message closest to it and its
// dead letter, or an equal message that arrived elsewhere; then the nodes that filtered,
// dead-lettered, dropped or retried messages. When nothing is missing (messages arrived out of
// order or more than expected) it names the nodes that retried. It says only what the facts show,
// and nothing when they show nothing relevant.
func Explain(f *Failure, e *testfile.Expect, actual []Arrived, facts Facts) {
	c := newComparison(e, actual)
	var missing []message
	if e.HasMessages {
		for i, j := range c.pair {
			if j < 0 {
				missing = append(missing, c.exp[i])
			}
		}
	}
	short := len(missing) > 0 || e.HasCount && len(actual) < e.Count
	x := explainer{c: c, facts: facts, usedDL: map[int]bool{}}
	var why []string
	if short {
		if len(facts.Sent) == 0 {
			why = append(why, "the run sent no messages")
		}
		for n, m := range missing {
			if n == maxTraced {
				why = append(why, fmt.Sprintf("(%d more missing messages not traced)", len(missing)-maxTraced))
				break
			}
			why = append(why, x.trace(m)...)
		}
		why = append(why, x.nodeLines()...)
	} else {
		// Messages arrived out of order or more than expected: a retry is what reorders or
		// delivers twice, so say where there were retries.
		why = append(why, x.retryLines()...)
	}
	f.Why = appendNew(f.Why, why...)
}

type explainer struct {
	c      *comparison
	facts  Facts
	usedDL map[int]bool // dead letters already named by a traced message
}

// trace follows one missing message: to the dead letter of the sent message it came from, or to
// another sink or topic where it arrived.
func (x *explainer) trace(m message) []string {
	label := clip(m.val.canon, 50) + ": "
	sent, hasSent := x.closestSent(m)
	if d, how := x.deadLetterFor(m, sent, hasSent); d >= 0 {
		x.usedDL[d] = true
		dl := x.facts.DeadLetters[d]
		what := "dead-lettered"
		switch how {
		case sentEqual:
			what = "the message sent as " + clip(sent.canon, 50) + " was dead-lettered"
		case similar:
			what = "a similar message was dead-lettered"
		}
		return []string{fmt.Sprintf("%s%s by %s after %d %s: %s", label, what, dl.Node,
			dl.Attempts, plural(dl.Attempts, "attempt", "attempts"), clip(dl.Reason, 80))}
	}
	if line := x.elsewhere(m); line != "" {
		return []string{label + line}
	}
	return nil
}

// closestSent is the sent message with the most fields equal to m's: what m was likely made from.
// None when no sent message is alike (see alike).
func (x *explainer) closestSent(m message) (value, bool) {
	best, bestScore := value{}, 0
	for _, s := range x.facts.Sent {
		v := parseValue(s.Payload)
		if score := similarity(m.val, v); score > bestScore && alike(m.val, score) {
			best, bestScore = v, score
		}
	}
	return best, bestScore > 0
}

// alike reports whether a similarity score to m is enough to name the other message as m's
// origin or fate: equal, or sharing at least half of m's fields. Less (one common "currency")
// would point at an unrelated message.
func alike(m value, score int) bool {
	if score == equalScore {
		return true
	}
	return score > 0 && m.valid && 2*score >= sharedLeaves(m.v, m.v)
}

// similarity counts the fields two values share; equal values score equalScore, more than any
// sharing.
func similarity(a, b value) int {
	if a.equal(b) {
		return equalScore
	}
	if !a.valid || !b.valid {
		return 0
	}
	return sharedLeaves(a.v, b.v)
}

// How a dead letter relates to a missing message.
const (
	expectedEqual = iota // its payload is the expected message
	sentEqual            // its payload is the sent message the expected one was likely made from
	similar              // it shares at least half the fields of one of them
)

// deadLetterFor is the dead letter whose payload equals m or the sent message, or else shares the
// most fields with either; -1 when none is alike. One not yet named by another traced message goes
// first among equals.
func (x *explainer) deadLetterFor(m message, sent value, hasSent bool) (index, how int) {
	best, bestScore, bestUsed := -1, 0, false
	for i, d := range x.facts.DeadLetters {
		v := parseValue(d.Payload)
		score, h := similarity(m.val, v), expectedEqual
		if hasSent {
			if s := similarity(sent, v); s > score {
				score, h = s, sentEqual
			}
		}
		if score != equalScore {
			h = similar
		}
		if !alike(m.val, score) && !(hasSent && alike(sent, score)) {
			continue
		}
		if best < 0 || score > bestScore || score == bestScore && bestUsed && !x.usedDL[i] {
			best, bestScore, bestUsed, how = i, score, x.usedDL[i], h
		}
	}
	return best, how
}

// elsewhere says where else a message equal to m arrived, or one that differs from it in a field
// or two. A sink is an end, so a message there arrived instead; a topic may be on the way.
func (x *explainer) elsewhere(m message) string {
	type near struct {
		where string
		diffs []fieldDiff
	}
	var closest *near
	for _, where := range sortedWheres(x.facts.Arrivals) {
		if where == x.c.where {
			continue
		}
		for _, a := range x.facts.Arrivals[where] {
			v := parseValue(a.Payload)
			if m.val.equal(v) {
				if strings.HasPrefix(where, "sink.") {
					return "arrived at " + where + " instead"
				}
				return "an equal message reached " + where
			}
			d := differences(m.val, v)
			// Only a sink is an end: a similar message in a topic is mostly the one that arrived,
			// on its way, which the diff shows already.
			if strings.HasPrefix(where, "sink.") && len(d) <= 2 && alike(m.val, similarity(m.val, v)) &&
				(closest == nil || len(d) < len(closest.diffs)) {
				closest = &near{where, d}
			}
		}
	}
	if closest == nil {
		return ""
	}
	var paths []string
	for _, d := range closest.diffs {
		paths = append(paths, d.path)
	}
	return fmt.Sprintf("a similar message arrived at %s (differs in: %s)", closest.where, strings.Join(paths, ", "))
}

// nodeLines say which nodes filtered, dead-lettered, dropped, absorbed or retried messages, or hold
// them for a retry, by their counters, or that none did.
func (x *explainer) nodeLines() []string {
	var lines []string
	lost := false
	for _, n := range x.facts.Nodes {
		if n.Filtered > 0 {
			lost = true
			line := fmt.Sprintf("%s filtered %d of %d %s", n.Name, n.Filtered, n.In, plural(int(n.In), "message", "messages"))
			if n.Condition != "" {
				line += " (the where at " + n.Condition + ")"
			}
			lines = append(lines, line)
		}
		if n.DeadLettered > 0 {
			lost = true
			if !x.namedDeadLetterOf(n.Name) {
				lines = append(lines, fmt.Sprintf("%s dead-lettered %d of %d %s", n.Name, n.DeadLettered, n.In, plural(int(n.In), "message", "messages")))
			}
		}
	}
	for _, n := range x.facts.Nodes {
		// The other outcomes of what a node took in (NodeSummary): they add up with the above.
		if n.Dropped > 0 {
			lost = true
			lines = append(lines, fmt.Sprintf("%s dropped %d of %d %s (late or repeated)%s", n.Name, n.Dropped, n.In,
				plural(int(n.In), "message", "messages"), x.droppedOf(n.Name)))
		}
		if late := n.Late - x.droppedLate(n.Name); late > 0 {
			// The late messages it did not drop went to its late topic or its dead letters, which
			// the lines above and the arrivals show.
			lines = append(lines, fmt.Sprintf("%s found %d more %s late (passed to its late topic or dead-lettered)",
				n.Name, late, plural(int(late), "message", "messages")))
		}
		if n.Absorbed > 0 {
			lines = append(lines, fmt.Sprintf("%s took %d of %d %s into its windows; its results come when they close", n.Name, n.Absorbed, n.In, plural(int(n.In), "message", "messages")))
		}
		lines = append(lines, x.waitingLines(n.Name)...)
		if n.InFlight > 0 {
			lost = true
			lines = append(lines, fmt.Sprintf("%s has %d %s waiting for a retry", n.Name, n.InFlight, plural(int(n.InFlight), "message", "messages")))
		}
	}
	if len(x.facts.DeadLetters) > 0 {
		lost = true
	}
	lines = append(lines, x.retryLines()...)
	if !lost && len(x.facts.Nodes) > 0 {
		lines = append(lines, "no node dropped, filtered or dead-lettered a message during the run")
	}
	return lines
}

// maxNamedDrops bounds how many dropped messages a line names.
const maxNamedDrops = 3

// droppedOf names the messages that node dropped, with why: ": {...} (late), ...".
func (x *explainer) droppedOf(node string) string {
	var named []string
	more := 0
	for _, d := range x.facts.Dropped {
		if d.Node != node {
			continue
		}
		if len(named) == maxNamedDrops {
			more++
			continue
		}
		text := clip(parseValue(d.Payload).canon, 60)
		if d.Key != "" {
			text = "key=" + keyText(d.Key) + " " + text
		}
		named = append(named, text+" ("+d.Why+")")
	}
	if len(named) == 0 {
		return ""
	}
	if more > 0 {
		named = append(named, fmt.Sprintf("and %d more", more))
	}
	return ": " + strings.Join(named, ", ")
}

// droppedLate counts the messages that node dropped as late.
func (x *explainer) droppedLate(node string) int64 {
	var n int64
	for _, d := range x.facts.Dropped {
		if d.Node == node && d.Why == "late" {
			n++
		}
	}
	return n
}

// waitingLines say, for each partition of node whose timers have not fired, its watermark and the
// next timer: a window that did not fire waits for the watermark to reach its end (plus grace).
func (x *explainer) waitingLines(node string) []string {
	var lines []string
	for _, w := range x.facts.Waiting {
		if w.Node != node {
			continue
		}
		watermark := "it has no watermark yet"
		if !w.Watermark.IsZero() {
			watermark = "its watermark is " + w.Watermark.Format(time.RFC3339Nano)
		}
		lines = append(lines, fmt.Sprintf("%s partition %d: %s; %d %s not fired, the next at %s, which fires when the watermark "+
			"reaches it (send a message with a later event time, or advance the clock)", node, w.Partition, watermark,
			w.Timers, plural(int(w.Timers), "timer has", "timers have"), w.NextTimer.Format(time.RFC3339Nano)))
	}
	return lines
}

// namedDeadLetterOf reports whether a traced message already named one of node's dead letters.
func (x *explainer) namedDeadLetterOf(node string) bool {
	for i := range x.usedDL {
		if x.facts.DeadLetters[i].Node == node {
			return true
		}
	}
	return false
}

func (x *explainer) retryLines() []string {
	var lines []string
	for _, n := range x.facts.Nodes {
		if n.Retries > 0 {
			lines = append(lines, fmt.Sprintf("%s retried %d %s", n.Name, n.Retries, plural(int(n.Retries), "time", "times")))
		}
	}
	return lines
}

// appendNew appends the lines not already in to.
func appendNew(to []string, lines ...string) []string {
	have := map[string]bool{}
	for _, l := range to {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			have[l] = true
			to = append(to, l)
		}
	}
	return to
}

// sortedWheres lists a map's sinks and topics by name.
func sortedWheres(m map[string][]Arrived) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
