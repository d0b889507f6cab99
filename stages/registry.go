package stages

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Message is one message as a stage function sees it.
type Message struct {
	// Key is the message's key: it picks the partition and orders the messages of one key. A function
	// may change it, unless it is registered with KeepsKey; the output topic's key expression, if
	// any, recomputes it.
	Key string
	// Value is the message's JSON payload, decoded: strings, json.Number numbers (which keep every
	// digit of large ids), bools, nil, []any and map[string]any. A function may modify and return it.
	Value map[string]any
	// Headers travel with the message from hop to hop (trace context is carried separately).
	Headers map[string]string
	// EntryTime is when the message's entry was added to the stream it was read from (its ID's
	// time): the event time of a message that carries none. Zero for a message a kind made.
	EntryTime time.Time

	// raw is the payload as it arrived, kept while it still describes the message so that it can be
	// passed on without decoding and encoding it again.
	raw []byte
	// checked: raw was checked as it was read (NewEntryMessage), so Decode need not check it again.
	checked bool
	// sizeHint is the length of the payload the message arrived with, once raw no longer holds it.
	sizeHint int
}

// Func processes one message and returns the messages to pass on: none to drop it, the same message
// to pass it, several to split it. An error fails this attempt; the stage's retry policy decides
// whether it is retried, unless the error is Permanent.
type Func func(ctx context.Context, m Message) ([]Message, error)

// StatefulFunc is a Go stage function that keeps state: per-key values and durable timers in its
// input partition, with the guarantees of the built-in stateful kinds (dedupe, aggregate). Its stage
// is stateful: it needs ordering = "key" or "partition", and processes each partition's messages one
// after another, in order. What Process and OnTimer write through state is committed with the
// acknowledgement of the batch, in one step fenced by the partition's lease; a failed attempt's
// writes are dropped with it; and the state moves with the lease, with nothing to restore, when
// another process takes the partition over. See State. The state is the input partition's:
// messages that share state must share a partition, so key the input topic by what the state is
// kept by (the message's key, say). Record counts what the function finds late or repeated, as
// the built-in kinds do.
//
// Time is event time. Before Process is called, the stage has observed the message's event time
// (the stage's event_time attribute, or the time its entry was written), so state.Watermark, the
// latest event time of the partition, includes it. A timer is due once the watermark reaches it.
type StatefulFunc struct {
	// Process processes one message, as a Func does, with the state of the message's partition.
	// Every call on state takes ctx.
	Process func(ctx context.Context, m Message, state State) ([]Message, error)
	// OnTimer, when set, is called for each due timer that Process or OnTimer set, earliest first,
	// with the state of the batch that moved the watermark past it; what it returns goes to the
	// stage's output, committed with that batch. The timer is cancelled unless OnTimer sets it again.
	// An error keeps the timer and processes the batch again; a Permanent one drops the timer. A
	// function without OnTimer cannot set timers.
	OnTimer func(ctx context.Context, timer string, at time.Time, state State) ([]Message, error)
	// FireAtEnd fires every timer of the stage when a job's inputs are drained (flowrun run
	// --until-drained), whatever the watermark: for timers that emit results, as windows do, so
	// that a job's output is complete. Leave it unset for timers that forget (the default), which
	// then stay for the next run.
	FireAtEnd bool
}

var registry = struct {
	sync.RWMutex
	funcs    map[string]registeredFunc
	stateful map[string]StatefulFunc
}{funcs: map[string]registeredFunc{}, stateful: map[string]StatefulFunc{}}

// registeredFunc is a function registered with Register, with what its registration declared.
type registeredFunc struct {
	fn       Func
	keepsKey bool
}

// A FuncOption declares, at registration, something about the function that the pipeline may rely
// on (KeepsKey).
type FuncOption func(*registeredFunc)

// KeepsKey declares that the function passes every message on with the key of the message it got
// (Message.Key): it returns that message, changed or not, or messages with its Key. A stage that
// reads the function's stage as stage.NAME may then run fused with it, in one hop (see Fusion in
// docs/running.md): a function that may set other keys ends a fused chain, since the stage after it
// would otherwise see a new key's messages from several input partitions at once instead of one at
// a time. The runtime holds the function to it: an output with another key fails the message for
// good (a Permanent error that names the function), and the message is dead-lettered.
func KeepsKey() FuncOption { return func(r *registeredFunc) { r.keepsKey = true } }

// Register makes fn available to pipelines as func = name in a stage of kind "go", with what the
// options declare about it (KeepsKey). It is meant for init functions and panics on an empty name,
// a nil function, or a name registered twice, since each is a programming error that must not
// reach production.
func Register(name string, fn Func, options ...FuncOption) {
	r := registeredFunc{fn: fn}
	for _, o := range options {
		o(&r)
	}
	register("Register", name, fn == nil, func() { registry.funcs[name] = r })
}

// RegisterStateful makes the stateful function fn available to pipelines as func = name in a stage
// of kind "go"; see Register, and StatefulFunc. It panics as Register does, and on a function
// without Process.
func RegisterStateful(name string, fn StatefulFunc) {
	register("RegisterStateful", name, fn.Process == nil, func() { registry.stateful[name] = fn })
}

func register(how, name string, missing bool, add func()) {
	if name == "" {
		panic("stages." + how + ": empty name")
	}
	if missing {
		panic(fmt.Sprintf("stages.%s(%q): nil function", how, name))
	}
	registry.Lock()
	defer registry.Unlock()
	_, plain := registry.funcs[name]
	_, stateful := registry.stateful[name]
	if plain || stateful {
		panic(fmt.Sprintf("stages.%s(%q): registered twice", how, name))
	}
	add()
}

// Lookup returns the function registered under name with Register.
func Lookup(name string) (Func, bool) {
	registry.RLock()
	defer registry.RUnlock()
	r, ok := registry.funcs[name]
	return r.fn, ok
}

// FuncKeepsKey reports whether the function registered under name with Register declared KeepsKey.
func FuncKeepsKey(name string) bool {
	registry.RLock()
	defer registry.RUnlock()
	return registry.funcs[name].keepsKey
}

// LookupStateful returns the function registered under name with RegisterStateful.
func LookupStateful(name string) (StatefulFunc, bool) {
	registry.RLock()
	defer registry.RUnlock()
	fn, ok := registry.stateful[name]
	return fn, ok
}

// Names lists the registered function names, of plain and stateful functions, sorted.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.funcs)+len(registry.stateful))
	for n := range registry.funcs {
		names = append(names, n)
	}
	for n := range registry.stateful {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
