package stages

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// TimerGrouper is a State that shares one timer among the members (a dedupe's keys) that a batch
// gives the same due time for the same purpose: a timer per member is a member of the partition's
// timer set per member, which costs Redis a sorted-set insertion each (a dedupe's first messages, a
// timer each, were a fifth of its Redis time). The runtime's State is one; where a State is not
// (a Go function's, a test's), SetTimerMember sets a timer per member.
type TimerGrouper interface {
	// AddTimerMember adds member to the timer of prefix due at at. The members added with the same
	// prefix and time in one batch (by attempts that succeed) share one timer, named
	// TimerGroupName(prefix, at, them).
	AddTimerMember(ctx context.Context, prefix string, at time.Time, member string) error
}

// SetTimerMember sets the timer of member due at at: with the other members of the batch due then
// where st groups timers (TimerGrouper), else on its own, named prefix+member.
//
// A member's timer is no single timer that moves: a member added again at another time, in a later
// batch, has a timer at each time it was added (two, where it shares one), and OnTimer must find
// out whether a member of a timer that fires is due (TimerMembers; a dedupe compares the key's
// first time with the watermark). Alone it is named prefix+member, as SetTimer would name it: a
// later timer of that member alone moves it.
func SetTimerMember(ctx context.Context, st State, prefix string, at time.Time, member string) error {
	if g, ok := st.(TimerGrouper); ok {
		return g.AddTimerMember(ctx, prefix, at, member)
	}
	return st.SetTimer(ctx, prefix+member, at)
}

// TimerGroupName is the name of the timer of members due at at (Unix ms), which share it: a NUL
// byte, prefix, at in decimal, then ":<length>:<member>" for each member, in the order given:
//
//	"\x00key:1767225600000:3:k17:2:k4"
//
// A timer of one member is named prefix+member instead, as SetTimer would name its own timer, unless
// the batch has another of that member alone (at another time: the member was added again) or the
// member begins with a NUL byte. The leading NUL byte keeps the name of a group from every name
// that prefix+member can be for a member without one (a dedupe's keys never begin with one), and
// from a name that a kind which knows nothing of groups (an earlier flowrun's dedupe) would take for
// one of its own.
func TimerGroupName(prefix string, at int64, members []string) string {
	n := 1 + len(prefix) + 20
	for _, m := range members {
		n += len(m) + 12
	}
	b := make([]byte, 0, n)
	b = append(b, 0)
	b = append(b, prefix...)
	b = strconv.AppendInt(b, at, 10)
	for _, m := range members {
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(len(m)), 10)
		b = append(b, ':')
		b = append(b, m...)
	}
	return string(b)
}

// TimerMembers returns the members of a timer that TimerGroupName named with prefix, appended to
// members; ok is false for a name that is none of them (another timer of the kind's, or a group
// name that does not parse).
func TimerMembers(prefix, name string, members []string) (_ []string, ok bool) {
	if rest, single := strings.CutPrefix(name, prefix); single {
		return append(members, rest), true
	}
	rest, group := strings.CutPrefix(name, "\x00"+prefix)
	if !group {
		return members, false
	}
	i := strings.IndexByte(rest, ':')
	if i < 0 {
		return members, false
	}
	if _, err := strconv.ParseInt(rest[:i], 10, 64); err != nil {
		return members, false
	}
	rest = rest[i:]
	start := len(members)
	for len(rest) > 0 {
		if rest[0] != ':' {
			return members[:start], false
		}
		j := strings.IndexByte(rest[1:], ':')
		if j < 0 {
			return members[:start], false
		}
		n, err := strconv.Atoi(rest[1 : 1+j])
		if err != nil || n < 0 || n > len(rest)-2-j {
			return members[:start], false
		}
		rest = rest[2+j:]
		members = append(members, rest[:n])
		rest = rest[n:]
	}
	return members, len(members) > start
}
