package runtime

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Every dead letter is logged at WARN, so that a failure never goes unnoticed, but a node that
// dead-letters thousands of messages must not flood the log: each node logs its first few dead
// letters of an interval one by one, and the rest as one line at the interval's end (or at the end
// of the run) that counts them and says how to list them.
//
// A dead letter is logged when it is made, not when its batch commits. A commit that fails makes
// the batch run again, so the same message may be logged (and counted) twice; logging after the
// commit would need the worker's commit path to carry the envelopes, and a missing warning is worse
// than a repeated one. The node's dead_lettered counter is counted at the same point, so the log and
// the counters agree.

const (
	// deadLetterLogEvery is the interval of the limit, and deadLetterLogBurst how many dead letters of
	// one node are logged one by one in each.
	deadLetterLogEvery = 10 * time.Second
	deadLetterLogBurst = 5
	// deadLetterReasons is how many distinct reasons per node the summary keeps, and
	// recentDeadLetters how many of the latest dead letters the live page shows.
	deadLetterReasons = 3
	recentDeadLetters = 5
)

// DeadLetterReason is a reason why a node dead-lettered messages, and how many.
type DeadLetterReason struct {
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

// RecentDeadLetter is one of the latest dead letters of a node: when it was made, and why.
type RecentDeadLetter struct {
	At     time.Time
	Reason string
}

// deadLetterLog rate-limits the dead-letter warnings and keeps the first reasons of each node.
type deadLetterLog struct {
	mu    sync.Mutex
	nodes map[string]*deadLetterTally
}

// deadLetterTally is one node's dead letters: those of the current interval and the reasons.
type deadLetterTally struct {
	typ, name  string
	since      time.Time // the current interval's start
	logged     int       // logged one by one since then
	suppressed int64     // counted, not logged, since then
	reasons    []DeadLetterReason
	recent     []RecentDeadLetter // the latest, oldest first
}

// record logs a dead letter of node n, or counts it for the interval's summary line. path is the
// pipeline's path for the command in that line.
func (l *deadLetterLog) record(log *slog.Logger, n *node, env *Envelope, reason, path string, now time.Time) {
	l.mu.Lock()
	if l.nodes == nil {
		l.nodes = map[string]*deadLetterTally{}
	}
	t := l.nodes[n.name]
	if t == nil {
		t = &deadLetterTally{typ: n.typ, name: n.name}
		l.nodes[n.name] = t
	}
	var summary *suppressedLine
	if now.Sub(t.since) >= deadLetterLogEvery {
		summary = t.restart(now)
	}
	t.addReason(reason)
	t.addRecent(RecentDeadLetter{At: now, Reason: reason})
	individual := t.logged < deadLetterLogBurst
	if individual {
		t.logged++
	} else {
		t.suppressed++
	}
	l.mu.Unlock()

	summary.log(log, path) // the previous interval's, before this one's first line
	if !individual {
		return
	}
	attrs := []any{"node", n.name, "node_type", n.typ, "partition", env.Partition, "key", env.Key, "id", env.ID,
		"attempts", env.Attempts, "reason", reason}
	if env.Stream != "" {
		attrs = append(attrs, "stream", env.Stream)
	}
	log.Warn("message dead-lettered", attrs...)
}

// flush logs the summary line of every node whose interval is over by now; with all, of every node
// that has dead letters not yet logged (the run ends).
func (l *deadLetterLog) flush(log *slog.Logger, path string, now time.Time, all bool) {
	var lines []*suppressedLine
	l.mu.Lock()
	for _, t := range l.nodes {
		if t.suppressed > 0 && (all || now.Sub(t.since) >= deadLetterLogEvery) {
			lines = append(lines, t.restart(now))
		}
	}
	l.mu.Unlock()
	for _, s := range lines {
		s.log(log, path)
	}
}

// reasons returns a copy of the first reasons of a node.
func (l *deadLetterLog) reasons(node string) []DeadLetterReason {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.nodes[node]; t != nil {
		return append([]DeadLetterReason(nil), t.reasons...)
	}
	return nil
}

// latest returns a node's latest dead letters, newest first.
func (l *deadLetterLog) latest(node string) []RecentDeadLetter {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.nodes[node]
	if t == nil {
		return nil
	}
	out := make([]RecentDeadLetter, len(t.recent))
	for i, d := range t.recent {
		out[len(out)-1-i] = d
	}
	return out
}

// restart begins a new interval at now, and returns the summary line of the one that ends, if it
// has one.
func (t *deadLetterTally) restart(now time.Time) *suppressedLine {
	var s *suppressedLine
	if t.suppressed > 0 {
		s = &suppressedLine{typ: t.typ, name: t.name, count: t.suppressed, over: now.Sub(t.since)}
	}
	t.since, t.logged, t.suppressed = now, 0, 0
	return s
}

func (t *deadLetterTally) addReason(reason string) {
	for i := range t.reasons {
		if t.reasons[i].Reason == reason {
			t.reasons[i].Count++
			return
		}
	}
	if len(t.reasons) < deadLetterReasons {
		t.reasons = append(t.reasons, DeadLetterReason{Reason: reason, Count: 1})
	}
}

func (t *deadLetterTally) addRecent(d RecentDeadLetter) {
	if len(t.recent) == recentDeadLetters {
		t.recent = append(t.recent[:0], t.recent[1:]...)
	}
	t.recent = append(t.recent, d)
}

// suppressedLine counts the dead letters of a node that an interval did not log one by one.
type suppressedLine struct {
	typ, name string
	count     int64
	over      time.Duration
}

func (s *suppressedLine) log(log *slog.Logger, path string) {
	if s == nil {
		return
	}
	over := max(s.over.Round(time.Second), time.Second)
	command := DeadLetterCommand(path, s.name)
	log.Warn(fmt.Sprintf("%d more dead letter%s from %s %s in the last %s; %s", s.count, pluralS(s.count), s.typ, s.name,
		over, command), "node", s.name, "node_type", s.typ, "dead_letters", s.count, "list", command)
}

// DeadLetterCommand is the command that lists a node's dead letters, for a pipeline at path.
func DeadLetterCommand(path, node string) string {
	if path == "" {
		path = "PATH"
	}
	return "flowrun dlq list " + shellQuote(path) + " --stage " + shellQuote(node)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@+,%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func pluralS(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}
