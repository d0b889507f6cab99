package admin

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// ResetOptions say what a reset removes.
type ResetOptions struct {
	// Node limits the reset to the keys of one source, stage or sink; empty: the whole pipeline.
	Node string
	// Topics also deletes the streams of the pipeline's topics (the whole pipeline only).
	Topics bool
}

// ResetItem is one thing a reset removes: a key, or a consumer group on a stream.
type ResetItem struct {
	// Key is the key to delete, or the stream whose consumer group Group is destroyed.
	Key   string `json:"key"`
	Group string `json:"group,omitempty"`
	// AtEnd recreates Group empty at the end of its stream instead of destroying it: a reader of a
	// topic the pipeline writes itself, which the rerun writes again.
	AtEnd bool `json:"at_end,omitempty"`
	// Node is the source, stage or sink the item belongs to; empty for what the pipeline's nodes
	// share (topic streams, watermarks, the members set).
	Node string `json:"node,omitempty"`
	// What says what the item holds, for example "state" or "consumer group".
	What string `json:"what"`
}

// Holder is a process that runs part of the pipeline: it holds a lease, or its membership is live.
type Holder struct {
	Process string
	// Key is the lease it holds, or the members set where it is live.
	Key string
	// Left is how long the lease or the membership lasts unless renewed.
	Left time.Duration
}

// Reset is what a reset of a pipeline would remove, listed by PlanReset and removed by Apply.
type Reset struct {
	Pipeline string
	// Items are what Apply removes, consumer groups first, then keys in name order.
	Items []ResetItem
	// Kept are keys under the prefix that the reset leaves alone: the topics' streams (without
	// Topics), the keys of other nodes and those the nodes share (with a Node), and Unknown, keys
	// whose names flowrun does not write.
	Streams, OtherNodes, Unknown []string
	// Holders are the processes running the pipeline now; Apply refuses while there are any.
	Holders []Holder

	c    *redis.Client
	plan *flow.Plan
}

// RunningError is Apply's refusal to pull keys from under a running pipeline.
type RunningError struct {
	Pipeline string
	Holders  []Holder
}

func (e *RunningError) Error() string {
	procs := map[string][]string{}
	var order []string
	for _, h := range e.Holders {
		if procs[h.Process] == nil {
			order = append(order, h.Process)
		}
		procs[h.Process] = append(procs[h.Process], h.Key)
	}
	var parts []string
	for _, p := range order {
		keys := procs[p]
		s := fmt.Sprintf("process %s holds %s", p, keys[0])
		if len(keys) > 1 {
			s += fmt.Sprintf(" and %d more", len(keys)-1)
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("pipeline %s is running (%s): stop it, or wait for its leases to lapse, then reset", e.Pipeline, strings.Join(parts, "; "))
}

// topicPartitionTag matches the hash tag of a topic partition, "<topic>:<p>".
var topicPartitionTag = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*:[0-9]+$`)

// classify tells what a key under the prefix is, from its name after "<prefix>:" (docs/redis-keys.md
// lists them): the node it belongs to, what it holds, and whether it is a topic's stream. ok is false
// for a name flowrun does not write.
func classify(rest string) (node, what string, stream, ok bool) {
	switch {
	case rest == "members":
		return "", "membership", false, true
	case strings.HasPrefix(rest, "members:"):
		return strings.TrimPrefix(rest, "members:"), "membership", false, true
	case strings.HasPrefix(rest, "ratelimit:"):
		node, _, found := strings.Cut(strings.TrimPrefix(rest, "ratelimit:"), ":")
		return node, "rate limit", false, found
	case strings.HasPrefix(rest, "dlq:{"):
		node, tail, found := strings.Cut(strings.TrimPrefix(rest, "dlq:{"), "}")
		switch {
		case found && tail == "":
			return node, "dead letters", false, true
		case found && tail == ":replayed":
			return node, "replay marks", false, true
		case found && tail == ":payloads":
			return node, "payload index", false, true
		case found && strings.HasPrefix(tail, ":payload:") && len(tail) > len(":payload:"):
			return node, "offloaded payload", false, true
		}
		return "", "", false, false
	case strings.HasPrefix(rest, "source:{"):
		node, tail, found := strings.Cut(strings.TrimPrefix(rest, "source:{"), "}")
		what := map[string]string{":lease": "source lease", ":lease:fence": "lease fence",
			":position": "source position", ":upstream_lag": "upstream lag"}[tail]
		return node, what, false, found && what != ""
	case strings.HasPrefix(rest, "{"):
		tag, tail, found := strings.Cut(rest[1:], "}")
		if !found {
			return "", "", false, false
		}
		if tail == "" {
			return "", "topic partition", true, topicPartitionTag.MatchString(tag)
		}
		if tail == ":watermarks" {
			return "", "watermarks", false, true
		}
		// A topic partition's offloaded payloads are its entries' data: they go with the topic.
		if tail == ":payloads" {
			return "", "payload index", true, topicPartitionTag.MatchString(tag)
		}
		if strings.HasPrefix(tail, ":payload:") && len(tail) > len(":payload:") {
			return "", "offloaded payload", true, topicPartitionTag.MatchString(tag)
		}
		parts := strings.Split(strings.TrimPrefix(tail, ":"), ":")
		if len(parts) < 2 || parts[1] == "" {
			return "", "", false, false
		}
		node, extra := parts[1], strings.Join(parts[2:], ":")
		switch {
		case parts[0] == "lease" && extra == "":
			return node, "lease", false, true
		case parts[0] == "lease" && extra == "fence":
			return node, "lease fence", false, true
		case parts[0] == "lease" && extra == "commit":
			return node, "commit record", false, true
		case parts[0] == "dedup" && extra != "":
			return node, "dedup marker", false, true
		case parts[0] == "state" && extra == "partitions":
			return node, "state partition count", false, true
		case parts[0] == "state" && extra == "fingerprint":
			return node, "state fingerprint", false, true
		case extra != "":
			return "", "", false, false
		}
		what := map[string]string{"retry": "retries", "state": "state", "timers": "timers", "holds": "holds"}[parts[0]]
		return node, what, false, what != ""
	}
	return "", "", false, false
}

// nodeNames returns the names of the plan's sources, stages and sinks, sorted.
func nodeNames(plan *flow.Plan) []string {
	var names []string
	for _, s := range plan.Sources {
		names = append(names, s.Name)
	}
	for _, s := range plan.Stages {
		names = append(names, s.Name)
	}
	for _, s := range plan.Sinks {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names
}

// noNode is the error for a node name the plan does not have, listing those it has.
func noNode(plan *flow.Plan, node string) error {
	return fmt.Errorf("pipeline %s has no source, stage or sink %q; it has %s", plan.Name, node, strings.Join(nodeNames(plan), ", "))
}

// CheckResetOptions reports whether opts make sense for the plan: a node it has, and Topics only
// for the whole pipeline.
func CheckResetOptions(plan *flow.Plan, opts ResetOptions) error {
	if opts.Node == "" {
		return nil
	}
	names := nodeNames(plan)
	if i := sort.SearchStrings(names, opts.Node); i == len(names) || names[i] != opts.Node {
		return noNode(plan, opts.Node)
	}
	if opts.Topics {
		return fmt.Errorf("--topics deletes the topics that every node reads and writes: it resets a whole pipeline, not one node")
	}
	return nil
}

// PlanReset lists what a reset of the plan's pipeline removes from Redis, and the processes that
// run it now; now is the time membership is measured against. It changes nothing.
//
// It scans every key under the key prefix (every master of a cluster), so that keys of nodes the
// pipeline no longer has go too, and keeps only the names the runtime writes: a key prefix that
// starts another pipeline's ("flow" and "flow:b") leaves that pipeline's keys alone. Consumer groups
// are found on the streams of the plan's topics and of its redis_stream sources.
func PlanReset(ctx context.Context, c *redis.Client, plan *flow.Plan, opts ResetOptions, now time.Time) (*Reset, error) {
	if err := CheckResetOptions(plan, opts); err != nil {
		return nil, err
	}
	r := &Reset{Pipeline: plan.Name, c: c, plan: plan}
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	ours := func(node string) bool { return opts.Node == "" || node == opts.Node }

	// Consumer groups first. Without Topics a topic's entries stay, and what its readers read next
	// depends on who writes it: a topic the pipeline writes itself is written again by the rerun, so
	// its readers start at its end (reading its old entries too would process them twice); a topic
	// that only the outside writes is read again from its first entry (the group is destroyed, and
	// the runtime creates it at ID 0). A single node's reset re-reads its input from the first entry.
	if !opts.Topics {
		written := plan.WrittenTopics()
		for _, t := range plan.Topics {
			atEnd := written[t.Name] && opts.Node == ""
			what := "consumer group, read from the first entry"
			if atEnd {
				what = "consumer group, read from the topic's end"
			}
			for p := 0; p < t.Partitions; p++ {
				info, err := c.StreamStats(ctx, keys.Stream(t.Name, p))
				if err != nil {
					return nil, err
				}
				for _, g := range info.Groups {
					if ours(g.Name) {
						r.Items = append(r.Items, ResetItem{Key: info.Stream, Group: g.Name, AtEnd: atEnd, Node: g.Name, What: what})
					}
				}
			}
		}
	}
	for _, s := range plan.Sources {
		kind, err := stages.SourceKindOf(s)
		if err != nil {
			return nil, err
		}
		if kind.Stream == nil || !ours(s.Name) {
			continue
		}
		in := kind.Stream(s)
		info, err := c.StreamStats(ctx, in.Stream)
		if err != nil {
			return nil, err
		}
		for _, g := range info.Groups {
			if g.Name == in.Group {
				r.Items = append(r.Items, ResetItem{Key: in.Stream, Group: g.Name, Node: s.Name, What: "source's consumer group"})
			}
		}
	}

	all, err := c.KeysUnder(ctx, plan.KeyPrefix)
	if err != nil {
		return nil, err
	}
	for _, key := range all {
		node, what, stream, ok := classify(strings.TrimPrefix(key, plan.KeyPrefix+":"))
		switch {
		case !ok:
			r.Unknown = append(r.Unknown, key)
		case stream && !opts.Topics:
			r.Streams = append(r.Streams, key)
		case !ours(node), node == "" && opts.Node != "":
			r.OtherNodes = append(r.OtherNodes, key)
		default:
			r.Items = append(r.Items, ResetItem{Key: key, Node: node, What: what})
		}
	}
	if r.Holders, err = holders(ctx, c, plan, all, now); err != nil {
		return nil, err
	}
	return r, nil
}

// holders returns the processes that hold a lease among keys, or whose membership in the
// pipeline is live at now.
func holders(ctx context.Context, c *redis.Client, plan *flow.Plan, all []string, now time.Time) ([]Holder, error) {
	var out []Holder
	for _, key := range all {
		if _, what, _, _ := classify(strings.TrimPrefix(key, plan.KeyPrefix+":")); what != "lease" && what != "source lease" {
			continue
		}
		l, ttl, held, err := c.LeaseHolder(ctx, key)
		if err != nil {
			return nil, err
		}
		if held {
			out = append(out, Holder{Process: l.Owner, Key: key, Left: ttl})
		}
	}
	membersKey := redis.Keys{Prefix: plan.KeyPrefix}.Members()
	members, err := c.Members(ctx, membersKey)
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		if left := m.Expires.Sub(now); left > 0 {
			out = append(out, Holder{Process: m.ID, Key: membersKey, Left: left})
		}
	}
	return out, nil
}

// Apply removes the items, unless a process runs the pipeline now: it looks again (the list may be
// old, a confirmation away) and returns a *RunningError naming the processes. A process that starts
// while the items are removed is not stopped; reset a pipeline whose processes are all stopped.
// It returns how many items existed and were removed.
func (r *Reset) Apply(ctx context.Context, now time.Time) (int, error) {
	all, err := r.c.KeysUnder(ctx, r.plan.KeyPrefix)
	if err != nil {
		return 0, err
	}
	running, err := holders(ctx, r.c, r.plan, all, now)
	if err != nil {
		return 0, err
	}
	if len(running) > 0 {
		return 0, &RunningError{Pipeline: r.Pipeline, Holders: running}
	}
	removed := 0
	for _, it := range r.Items {
		if it.Group != "" && it.AtEnd {
			if err := r.c.RecreateGroupAtEnd(ctx, it.Key, it.Group); err != nil {
				return removed, err
			}
			removed++
			continue
		}
		if it.Group != "" {
			existed, err := r.c.DestroyGroup(ctx, it.Key, it.Group)
			if err != nil && !strings.Contains(err.Error(), "no such key") {
				return removed, err
			}
			if existed {
				removed++
			}
			continue
		}
		n, err := r.c.DeleteKeys(ctx, it.Key)
		if err != nil {
			return removed, err
		}
		removed += int(n)
	}
	return removed, nil
}
