package stages

import (
	"slices"
	"testing"
)

// A timer group's name gives back its members, whatever bytes they hold (the separators, digits,
// nothing, a NUL byte); a member alone is prefix+member; a name that is neither is no timer of
// the prefix's.
func TestTimerGroupNamesGiveBackTheirMembers(t *testing.T) {
	for _, members := range [][]string{
		{"a", "b"},
		{"", ":", "1:2", "x:10:y", "\x00k", "ünïcode"},
		{"\x00alone"},
		{"k"},
	} {
		name := TimerGroupName("key:", -42, members)
		got, ok := TimerMembers("key:", name, []string{"before"})
		if !ok || !slices.Equal(got, append([]string{"before"}, members...)) {
			t.Errorf("%q: members %q, %v; want %q", name, got, ok, members)
		}
	}
	if got, ok := TimerMembers("key:", "key:k:1", nil); !ok || !slices.Equal(got, []string{"k:1"}) {
		t.Errorf("a member alone: %q, %v", got, ok)
	}
	for _, name := range []string{"c:k", "\x00c:1:1:k", "\x00key:", "\x00key:x:1:k", "\x00key:1:2:k", "\x00key:1", "\x00key:1:1k"} {
		if got, ok := TimerMembers("key:", name, nil); ok {
			t.Errorf("%q: members %q, want none", name, got)
		}
	}
}
