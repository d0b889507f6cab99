package modeltest

import (
	"fmt"
	"slices"
)

// Diff compares what a sink received with what the model says, as multisets of payloads: each
// line says what is missing or extra, and how often. It gives at most limit lines, then how many
// more there are.
func Diff(got, want []Message, limit int) []string {
	counts := map[string]int{}
	for _, m := range got {
		counts[Canonical(m)]++
	}
	for _, m := range want {
		counts[Canonical(m)]--
	}
	return differences(counts, limit)
}

// DiffLost is the check for at-least-once delivery through kills, which may deliver a message
// twice (and so count it twice in a window): it lists what the model has and got lacks. A window's
// result counts as there when a result of the same group and window is, whatever its values.
func DiffLost(got, want []Message, limit int) []string {
	have := map[string]bool{}
	for _, m := range got {
		have[identity(m)] = true
	}
	counts := map[string]int{}
	for _, m := range want {
		if id := identity(m); !have[id] {
			counts[id]--
		}
	}
	return differences(counts, limit)
}

// identity is what DiffLost compares: a result's group and window, or a whole payload.
func identity(m Message) string {
	if w, ok := m["window"]; ok {
		return Canonical(map[string]any{"key": m["key"], "window": w})
	}
	return Canonical(m)
}

func differences(counts map[string]int, limit int) []string {
	var lines []string
	for m, n := range counts {
		switch {
		case n > 0:
			lines = append(lines, fmt.Sprintf("extra %dx: %s", n, m))
		case n < 0:
			lines = append(lines, fmt.Sprintf("missing %dx: %s", -n, m))
		}
	}
	slices.Sort(lines)
	if len(lines) > limit {
		lines = append(lines[:limit], fmt.Sprintf("... and %d more", len(lines)-limit))
	}
	return lines
}
