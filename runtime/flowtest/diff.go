package flowtest

import (
	"fmt"
	"strings"
)

// The diffs of failed expectations are written here rather than with a diff library: their lines
// are messages already paired as JSON values (the pairing decides which lines match, not the
// text), so all that is left is to print them and to shorten long runs of matching lines. The one
// text-like diff, the order of one key's messages, is a small LCS over those lines. go-cmp, already
// in the module's graph, diffs Go values in Go syntax and says its output is not stable, which
// suits test logs but not a report users read.

// A diffLine is one message of a diff: ' ' matched, '-' expected but not arrived, '+' arrived but
// not expected.
type diffLine struct {
	op    byte
	text  string
	notes []string // printed indented under the line: the closest arrival, ...
}

// matchContext is how many matching lines are kept on each side of a change; longer runs of
// matching lines are elided.
const matchContext = 3

// maxChangedLines bounds the removed and added lines a diff shows; a diff of thousands of
// messages is read from its start.
const maxChangedLines = 100

// renderDiff prints lines, one message a line, eliding long runs of matching ones, and stops after
// maxChangedLines changes.
func renderDiff(lines []diffLine) string {
	changed := 0
	for i, l := range lines {
		if l.op == ' ' {
			continue
		}
		if changed++; changed > maxChangedLines {
			rest := 0
			for _, l := range lines[i:] {
				if l.op != ' ' {
					rest++
				}
			}
			lines = append(lines[:i:i], diffLine{op: ' ', text: fmt.Sprintf("... and %d more differing messages", rest)})
			break
		}
	}
	var sb strings.Builder
	for i := 0; i < len(lines); {
		if lines[i].op != ' ' {
			writeLine(&sb, lines[i])
			i++
			continue
		}
		end := i
		for end < len(lines) && lines[end].op == ' ' {
			end++
		}
		head, tail := matchContext, matchContext
		if i == 0 {
			head = 0
		}
		if end == len(lines) {
			tail = 0
		}
		if i == 0 && end == len(lines) {
			head = matchContext // nothing but matches: show how they start
		}
		if end-i <= head+tail+1 {
			head, tail = end-i, 0
		}
		for _, l := range lines[i : i+head] {
			writeLine(&sb, l)
		}
		if elided := end - i - head - tail; elided > 0 {
			fmt.Fprintf(&sb, "  ... %d matching %s ...\n", elided, plural(elided, "message", "messages"))
		}
		for _, l := range lines[end-tail : end] {
			writeLine(&sb, l)
		}
		i = end
	}
	return strings.TrimSuffix(sb.String(), "\n")
}

func writeLine(sb *strings.Builder, l diffLine) {
	sb.WriteByte(l.op)
	sb.WriteByte(' ')
	sb.WriteString(l.text)
	sb.WriteByte('\n')
	for _, n := range l.notes {
		sb.WriteString("    ")
		sb.WriteString(n)
		sb.WriteByte('\n')
	}
}

// maxLCSCells bounds the table of sequenceDiff; past it the differing middle is shown as all
// removed, then all added, which is still correct, only less tidy.
const maxLCSCells = 4 << 20

// sequenceDiff diffs two sequences of lines as text: the expected order of a key's messages
// against the order they arrived in.
func sequenceDiff(want, got []string) []diffLine {
	prefix := 0
	for prefix < len(want) && prefix < len(got) && want[prefix] == got[prefix] {
		prefix++
	}
	suffix := 0
	for suffix < len(want)-prefix && suffix < len(got)-prefix &&
		want[len(want)-1-suffix] == got[len(got)-1-suffix] {
		suffix++
	}
	var out []diffLine
	for _, s := range want[:prefix] {
		out = append(out, diffLine{op: ' ', text: s})
	}
	out = append(out, lcsDiff(want[prefix:len(want)-suffix], got[prefix:len(got)-suffix])...)
	for _, s := range want[len(want)-suffix:] {
		out = append(out, diffLine{op: ' ', text: s})
	}
	return out
}

func lcsDiff(a, b []string) []diffLine {
	var out []diffLine
	if len(a)*len(b) > maxLCSCells {
		for _, s := range a {
			out = append(out, diffLine{op: '-', text: s})
		}
		for _, s := range b {
			out = append(out, diffLine{op: '+', text: s})
		}
		return out
	}
	// l[i][j] is the length of the longest common subsequence of a[i:] and b[j:].
	l := make([][]int, len(a)+1)
	for i := range l {
		l[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				l[i][j] = l[i+1][j+1] + 1
			} else {
				l[i][j] = max(l[i+1][j], l[i][j+1])
			}
		}
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			out = append(out, diffLine{op: ' ', text: a[i]})
			i++
			j++
		case i < len(a) && (j == len(b) || l[i+1][j] >= l[i][j+1]):
			out = append(out, diffLine{op: '-', text: a[i]})
			i++
		default:
			out = append(out, diffLine{op: '+', text: b[j]})
			j++
		}
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
