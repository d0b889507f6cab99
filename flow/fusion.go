package flow

import "strings"

// Fusion: consecutive stages that a pipeline chains with stage references (input = stage.NAME)
// run as one hop. The first stage of a chain reads its input topic; each stage's results go to the
// next one in memory instead of through a stream; the last one writes the chain's outputs, with
// the input's acknowledgement, in one commit. A topic block that a user declared is always a
// stream: fusion only removes the implicit topics that no block names.

// A Chain is a run of two or more stages that run in one hop, in order: Stages[0] reads the chain's
// input topic, and each later stage reads its predecessor's implicit output.
type Chain struct {
	Stages []*Stage
}

// Name names the chain for graphs and logs: its stages joined by "+".
func (c *Chain) Name() string { return strings.Join(c.Names(), "+") }

// Names lists the chain's stages' names, in order.
func (c *Chain) Names() []string {
	names := make([]string, len(c.Stages))
	for i, s := range c.Stages {
		names[i] = s.Name
	}
	return names
}

// Head is the chain's first stage, the one that reads its input.
func (c *Chain) Head() *Stage { return c.Stages[0] }

// Fused reports whether topic t is a link inside a chain: an implicit topic that no stream holds,
// since its writer hands its messages to its reader in memory.
func (p *Plan) Fused(t *Topic) bool {
	c, _ := p.LinkOf(t)
	return c != nil
}

// LinkOf returns the chain inside which topic t is a link, and the stage that reads it there; nil
// when t is no link.
func (p *Plan) LinkOf(t *Topic) (*Chain, *Stage) {
	for _, c := range p.Chains {
		for _, s := range c.Stages[1:] {
			if s.Input == t {
				return c, s
			}
		}
	}
	return nil, nil
}

// fuseStages finds the plan's chains (Plan.Chains, Stage.Chain). Stage b joins the chain of the
// stage a before it when:
//   - b reads a's implicit output (input = stage.a, and a declares no output topic), and nothing
//     else reads it, not even a test file (readers counts those);
//   - neither keeps state: a stateful stage's state and watermark belong to its input partition;
//   - a keeps every message's key (Kind.KeepsKey): the chain runs in the lanes of its first
//     stage's input partitions and keys, so a message that a passed on with another key would
//     reach b in the lane of the old one, and a new key's messages from several partitions at
//     once, where a stream between them gives b each key in one partition, in order;
//   - neither sets fuse = false, and b is not a repartition stage;
//   - they have the same delivery, and b's ordering asks no more than a's: in a chain every stage
//     works in the lanes of the chain's first stage (ordering "partition" is stricter than "key",
//     which is stricter than "none").
func (p *Plan) fuseStages(extraReaders map[string]bool) {
	for _, s := range p.Stages {
		s.Chain = nil
	}
	p.Chains = nil
	readers := map[*Topic]int{}
	byName := map[string]*Stage{}
	for _, s := range p.Stages {
		byName[s.Name] = s
		if s.Input != nil {
			readers[s.Input]++
		}
	}
	for _, s := range p.Sinks {
		if s.Input != nil {
			readers[s.Input]++
		}
	}
	for _, s := range p.Stages { // in dependency order: a comes before b
		a := s.upstreamFused(byName, readers, extraReaders)
		if a == nil {
			continue
		}
		if a.Chain == nil {
			a.Chain = &Chain{Stages: []*Stage{a}}
			p.Chains = append(p.Chains, a.Chain)
		}
		a.Chain.Stages = append(a.Chain.Stages, s)
		s.Chain = a.Chain
	}
}

// upstreamFused returns the stage that s fuses with, or nil (see fuseStages).
func (s *Stage) upstreamFused(stages map[string]*Stage, readers map[*Topic]int, extraReaders map[string]bool) *Stage {
	t := s.Input
	if t == nil || !t.Implicit || t.Stage == "" || readers[t] != 1 || extraReaders[t.Name] {
		return nil
	}
	a := stages[t.Stage]
	if a == nil || a.Output != t || !s.Fuse || !a.Fuse || s.Kind == RepartitionKind || a.Kind == RepartitionKind {
		return nil
	}
	if a.stateful() || s.stateful() || !a.keepsKey() || a.Delivery != s.Delivery {
		return nil
	}
	if orderingStrictness(s.Ordering) > orderingStrictness(a.Ordering) {
		return nil
	}
	return a
}

func (s *Stage) stateful() bool {
	return s.Spec == nil || (s.Spec.Stateful != nil && s.Spec.Stateful(s.Config))
}

// keepsKey reports whether the stage passes every message on with the key it arrived with.
func (s *Stage) keepsKey() bool {
	return s.Spec != nil && s.Spec.KeepsKey != nil && s.Spec.KeepsKey(s.Config)
}

func orderingStrictness(o Ordering) int {
	switch o {
	case OrderNone:
		return 0
	case OrderByKey:
		return 1
	default:
		return 2
	}
}

// UnfuseTopics runs unfused the links of the plan's chains that are the named topics (all of them
// for AnyTopic), for a test file that sends into a stage's implicit output or reads it: a fused link
// is no stream.
func (p *Plan) UnfuseTopics(names map[string]bool) {
	switch {
	case names[AnyTopic]:
		p.Unfuse()
	case len(names) > 0:
		p.fuseStages(names)
	}
}

// AnyTopic, among the names given to UnfuseTopics, stands for every topic.
const AnyTopic = "*"

// Unfuse runs every stage of the plan in a hop of its own, as if each set fuse = false.
func (p *Plan) Unfuse() {
	for _, s := range p.Stages {
		s.Chain = nil
	}
	p.Chains = nil
}

// FusedAfter reports whether the stage runs fused after another one: its input is a link of its
// chain, which the chain's first stage reads for it.
func (s *Stage) FusedAfter() bool { return s.Chain != nil && s.Chain.Head() != s }
