package stages

import (
	"fmt"
	"sync"
	"time"

	"github.com/flowrun/flowrun/flow"
)

// A kind is registered once, in the file that implements it, with its spec (the attributes and docs
// the language shows for it, a flow.Kind), its traits (what the runtime must know to run it) and
// its constructor. Registration hands the spec to flow, so that validation, the JSON Schema and the
// reference docs know the kind, and keeps the constructor for the runtime. Packages outside
// flowrun register their kinds the same way, from init functions.

// StageKind registers a kind of stage.
type StageKind struct {
	Spec   *flow.Kind
	Traits StageTraits
	// TraitsOf, when set, gives the traits of each stage from its configuration, in place of
	// Traits, for a kind whose traits depend on it: a go stage is stateful when its function is.
	TraitsOf func(config flow.Attrs) StageTraits
	// New makes the processor of a stage that keeps no state; NewStateful a stateful one
	// (StageTraits.Stateful), whose processor gets its state with each message, with what else it
	// does (timers, prefetching, a watermark of its results). A kind sets the one its traits call
	// for, or both when they depend on the configuration.
	New         func(s *flow.Stage, env Env) (Processor, error)
	NewStateful func(s *flow.Stage, env Env) (StatefulStage, error)
}

// TraitsFor returns the traits of a stage of the kind with this configuration.
func (k StageKind) TraitsFor(config flow.Attrs) StageTraits {
	if k.TraitsOf != nil {
		return k.TraitsOf(config)
	}
	return k.Traits
}

// StageTraits are what the runtime must know of a stage kind besides its constructor.
type StageTraits struct {
	// Inline kinds only compute, quickly: the runtime processes their messages one after another
	// in the goroutine that reads them, as lanes would cost more than they save, but for a large
	// batch of a stateless one, split in contiguous parts processed at once, one per core: Process
	// is then called for several messages at a time, and keeps nothing of one for the next. Kinds
	// with side effects or waits (a Go function may call a service) run in lanes (concurrency).
	Inline bool
	// Stateful kinds keep per-key state and timers, which their processor (StatefulProcessor) gets
	// with each message; what else the stage does, NewStateful declares (StatefulStage). Their
	// stages need a lease per partition (an ordering other than "none"), so that one process at a
	// time owns the state.
	Stateful bool
	// KeepsKey declares that the kind's outputs keep the key of the message they came from
	// (Output.Message.Key is the input's): filter, map and route do, a go stage does when its
	// function is registered with KeepsKey. Only after such a stage may the next one run fused, in
	// the same hop (flow.Kind.KeepsKey). The runtime holds a kind to it: an output with another key
	// fails the message for good, and it is dead-lettered.
	KeepsKey bool
	// Conditional kinds pass a message on, or not, by conditions written in the stage's block:
	// filter's where, route's cases. What such a stage filters was refused there, and flowrun
	// test's explanation of a missing message points at the block.
	Conditional bool
	// MaxRead, when above 0, is the most entries one read of the stage's input takes (and of the
	// chain it is fused into). A stage commits its outputs with its batch, so a kind whose messages
	// wait for their turn (rate_limit) reads no more than may go at once: what it passes on then
	// leaves it at the pace it allows, not in one burst when a long batch ends.
	MaxRead int
}

// SinkKind registers a kind of sink.
type SinkKind struct {
	Spec   *flow.Kind
	Traits SinkTraits
	New    func(s *flow.Sink, env Env) (Sink, error)
	// Streams, for a sink that writes to Redis (Write), lists the streams it writes to, so that
	// the runtime checks its permissions on them before the run starts. It is what marks such a
	// sink: flowrun test lets it write, as its writes stay in the test's own Redis.
	Streams func(s *flow.Sink) []string
}

// SinkTraits are what the runtime must know of a sink kind besides its constructor.
type SinkTraits struct {
	// Inline sinks deliver quickly and locally (a file, the batch's own Redis round trip): they
	// deliver in the reading goroutine, as lanes would not help.
	Inline bool
	// Lanes is how many messages of a partition a sink has in flight at once, keeping each key's
	// order; 0 means DefaultSinkLanes.
	Lanes int
}

// SourceKind registers a kind of source: one that produces messages (New), or one that names a
// Redis stream for the runtime to read (Stream). Exactly one of the two is set.
type SourceKind struct {
	Spec   *flow.Kind
	Traits SourceTraits
	New    func(s *flow.Source, env Env) (Source, error)
	Stream func(s *flow.Source) StreamSource
}

// SourceTraits are what the runtime must know of a producing source kind besides its constructor.
type SourceTraits struct {
	// Shared sources run in every process that runs the pipeline (each reads its own standard
	// input); others in one process at a time, which holds the source's lease.
	Shared bool
	// Resumes marks a source that records a position with its writes (Origin.Position) and
	// resumes there after a restart; others start from their first message again.
	Resumes bool
	// Finite reports whether the source ends by itself, and how many messages it will produce
	// when it can tell (total < 0: it cannot); nil means finite, total unknown.
	Finite func(config flow.Attrs) (finite bool, total int64)
}

// Defaults of the runtime for kinds that do not say otherwise.
const (
	DefaultSinkLanes   = 4                // SinkTraits.Lanes
	DefaultSinkTimeout = 30 * time.Second // how long one delivery may take (see Timeouter)
)

var kinds = struct {
	sync.RWMutex
	stages  map[string]StageKind
	sinks   map[string]SinkKind
	sources map[string]SourceKind
}{stages: map[string]StageKind{}, sinks: map[string]SinkKind{}, sources: map[string]SourceKind{}}

// RegisterStage registers a stage kind. Like Register it is meant for init functions, and panics on
// a spec without a name, a missing constructor or a kind registered twice. It tells the language
// which stages of the kind are stateful (flow.Kind.Stateful), so that validate checks their
// ordering, and which keep their messages' keys (flow.Kind.KeepsKey), so that stages fuse after them.
func RegisterStage(k StageKind) {
	checkRegistration("stage", k.Spec, k.New != nil || k.NewStateful != nil)
	kinds.Lock()
	defer kinds.Unlock()
	k.Spec.Stateful = func(config flow.Attrs) bool { return k.TraitsFor(config).Stateful }
	k.Spec.KeepsKey = func(config flow.Attrs) bool { return k.TraitsFor(config).KeepsKey }
	flow.RegisterKind("stage", k.Spec)
	kinds.stages[k.Spec.Name] = k
}

// RegisterSink registers a sink kind; see RegisterStage.
func RegisterSink(k SinkKind) {
	checkRegistration("sink", k.Spec, k.New != nil)
	kinds.Lock()
	defer kinds.Unlock()
	flow.RegisterKind("sink", k.Spec)
	kinds.sinks[k.Spec.Name] = k
}

// RegisterSource registers a source kind; see RegisterStage.
func RegisterSource(k SourceKind) {
	checkRegistration("source", k.Spec, (k.New != nil) != (k.Stream != nil))
	kinds.Lock()
	defer kinds.Unlock()
	flow.RegisterKind("source", k.Spec)
	kinds.sources[k.Spec.Name] = k
}

func checkRegistration(family string, spec *flow.Kind, built bool) {
	if spec == nil || spec.Name == "" {
		panic(fmt.Sprintf("stages: a %s kind needs a spec with a name", family))
	}
	if !built {
		panic(fmt.Sprintf("stages: %s kind %q needs one constructor", family, spec.Name))
	}
}

// StageKindOf returns the registration of a stage's kind.
func StageKindOf(s *flow.Stage) (StageKind, error) {
	return lookup(kinds.stages, "stage", s.Name, s.Kind)
}

// SinkKindOf returns the registration of a sink's kind.
func SinkKindOf(s *flow.Sink) (SinkKind, error) { return lookup(kinds.sinks, "sink", s.Name, s.Kind) }

// SourceKindOf returns the registration of a source's kind.
func SourceKindOf(s *flow.Source) (SourceKind, error) {
	return lookup(kinds.sources, "source", s.Name, s.Kind)
}

func lookup[K any](registered map[string]K, family, name, kind string) (K, error) {
	kinds.RLock()
	defer kinds.RUnlock()
	k, ok := registered[kind]
	if !ok {
		return k, fmt.Errorf("%s %s: unknown kind %q", family, name, kind)
	}
	return k, nil
}

// Compile builds the processor of a stage of the plan that keeps no state.
func Compile(s *flow.Stage, env Env) (Processor, error) {
	k, err := StageKindOf(s)
	if err != nil {
		return nil, err
	}
	if k.New == nil || k.TraitsFor(s.Config).Stateful {
		return nil, fmt.Errorf("stage %s: a %s stage keeps state: CompileStateful builds it", s.Name, s.Kind)
	}
	return k.New(s, env)
}

// CompileStateful builds a stateful stage of the plan, and checks that what its kind declares of
// it holds together.
func CompileStateful(s *flow.Stage, env Env) (StatefulStage, error) {
	k, err := StageKindOf(s)
	if err != nil {
		return StatefulStage{}, err
	}
	if k.NewStateful == nil || !k.TraitsFor(s.Config).Stateful {
		return StatefulStage{}, fmt.Errorf("stage %s: a %s stage keeps no state: Compile builds it", s.Name, s.Kind)
	}
	st, err := k.NewStateful(s, env)
	if err != nil {
		return StatefulStage{}, err
	}
	results := k.Spec.Results
	switch {
	case st.Processor == nil:
		err = fmt.Errorf("stage %s: the %s kind made a stateful stage without a Processor", s.Name, s.Kind)
	case st.FireAtEnd && st.TimerHandler == nil:
		err = fmt.Errorf("stage %s: the %s kind fires its timers at the end, but declares no TimerHandler", s.Name, s.Kind)
	case results != (st.OutputWatermarker != nil):
		err = fmt.Errorf("stage %s: the %s kind writes results of its own (flow.Kind.Results: %v) but declares an OutputWatermarker: %v; a kind declares both or neither",
			s.Name, s.Kind, results, st.OutputWatermarker != nil)
	}
	return st, err
}
