package stages

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/flowrun/flowrun/flow"
)

// The aggregate and dedupe kinds bound the keys that a partition's state may hold (max_keys): a
// message that would add a key past the bound is dead-lettered, and the messages of the keys held
// go on. The count is an entry of the state itself (KeyCountKey), which the kinds keep with every
// Put that adds a key and every Delete that forgets one. It is written in the same batch, so it
// stays exact through failed attempts, retries, crashes and takeovers, as the keys themselves do. It
// is kept whether or not max_keys is set, so that setting max_keys later starts from the true count.

// KeyCountKey is the state entry that counts a partition's keys: a dedupe stage's remembered keys,
// an aggregate stage's groups with open windows, in decimal. It begins with a NUL byte, as the
// runtime's own fields do, so that no key of the kinds can be it (flowrun inspect --state reads it).
const KeyCountKey = "\x00keys"

// checkStateKey refuses a key of a message that would be one of the state entries that are
// flowrun's own (those that begin with a NUL byte, KeyCountKey among them): the message would
// overwrite them. It is a permanent error: the same message has the same key on every attempt.
func checkStateKey(key string) error {
	if strings.HasPrefix(key, "\x00") {
		return Permanent(fmt.Errorf("the key %q begins with a NUL byte: the state entries that do are flowrun's own", key))
	}
	return nil
}

// maxKeysField is the attribute of the kinds that bound their keys.
const maxKeysField = "max_keys"

// maxKeysAttribute declares max_keys for a kind whose keys are what; until says when one stops
// counting.
func maxKeysAttribute(what, until string) flow.Attribute {
	return flow.Attribute{
		Name: maxKeysField, Type: flow.TypeInteger, Min: flow.Bound(1), DefaultDoc: "no limit",
		Doc: "How many " + what + " the state of one input partition may hold. A message that would add one more " +
			"is dead-lettered, saying so; the messages of those already held go on. " + until,
	}
}

// keyLimit is a stage's max_keys.
type keyLimit struct {
	stage string
	max   int64 // 0: no limit
}

func newKeyLimit(s *flow.Stage) keyLimit {
	return keyLimit{stage: s.Name, max: s.Config.Int(maxKeysField)}
}

// admit counts a new key in, or refuses it with a permanent error (its message is dead-lettered)
// when the partition holds max_keys already.
func (l keyLimit) admit(ctx context.Context, state State) error {
	n, err := keyCount(ctx, state)
	if err != nil {
		return err
	}
	if l.max > 0 && n >= l.max {
		return Permanent(fmt.Errorf("partition %d of stage %s already holds max_keys = %d keys", state.Partition(), l.stage, l.max))
	}
	return state.Put(ctx, KeyCountKey, strconv.AppendInt(nil, n+1, 10))
}

// release counts a forgotten key out.
func (l keyLimit) release(ctx context.Context, state State) error {
	n, err := keyCount(ctx, state)
	if err != nil || n == 0 {
		return err // 0: keys of a state written before the count was kept
	}
	return state.Put(ctx, KeyCountKey, strconv.AppendInt(nil, n-1, 10))
}

func keyCount(ctx context.Context, state State) (int64, error) {
	v, found, err := state.Get(ctx, KeyCountKey)
	if err != nil || !found {
		return 0, err
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, Permanent(fmt.Errorf("the state's key count is %q, not a number", v))
	}
	return n, nil
}

// MaxKeys returns a stage's max_keys: 0 when it sets none, or its kind has no such bound.
func MaxKeys(s *flow.Stage) int64 {
	if s.Spec == nil {
		return 0
	}
	for _, a := range s.Spec.Attributes {
		if a.Name == maxKeysField {
			return s.Config.Int(maxKeysField)
		}
	}
	return 0
}
