package stages

import (
	"fmt"
	"sort"
	"sync"
)

// The registry of Go stage functions by name: Register and RegisterStateful add to it, from init
// functions; the go kind (stage_go.go) and validate (Names) look functions up in it.

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
