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
	// may change it; the output topic's key expression, if any, recomputes it.
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
	// sizeHint is the length of the payload the message arrived with, once raw no longer holds it.
	sizeHint int
}

// Func processes one message and returns the messages to pass on: none to drop it, the same message
// to pass it, several to split it. An error fails this attempt; the stage's retry policy decides
// whether it is retried, unless the error is Permanent.
type Func func(ctx context.Context, m Message) ([]Message, error)

var registry = struct {
	sync.RWMutex
	funcs map[string]Func
}{funcs: map[string]Func{}}

// Register makes fn available to pipelines as func = name in a stage of kind "go". It is meant for
// init functions and panics on an empty name, a nil function, or a name registered twice, since
// each is a programming error that must not reach production.
func Register(name string, fn Func) {
	if name == "" {
		panic("stages.Register: empty name")
	}
	if fn == nil {
		panic(fmt.Sprintf("stages.Register(%q): nil function", name))
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.funcs[name]; dup {
		panic(fmt.Sprintf("stages.Register(%q): registered twice", name))
	}
	registry.funcs[name] = fn
}

// Lookup returns the function registered under name.
func Lookup(name string) (Func, bool) {
	registry.RLock()
	defer registry.RUnlock()
	fn, ok := registry.funcs[name]
	return fn, ok
}

// Names lists the registered function names, sorted.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.funcs))
	for n := range registry.funcs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
