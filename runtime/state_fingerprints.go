package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/flowrun/flowrun/flow"
)

// A stateful stage's state means something only under the definition it was written by: an
// aggregate's accumulators for its group_by, windows and aggregate set; a dedupe's keys for its
// key. Run under another (a window of 5 minutes where state holds windows of 1), the stage would
// mix old and new meanings without a word. So the run records, per stateful stage, the fingerprint
// of its state's shape (flow.Plan.StateShapes) when the stage first runs
// (Keys.StateFingerprint), and refuses to start the stage, at start as on a reload, with another
// fingerprint while that record exists; unless Options.ResetState names the stage: its state is
// deleted (every partition's state hash, timers and holds), the new fingerprint recorded, and it
// starts afresh. A change that leaves the fingerprint alone (an aggregate's grace, emit or output)
// keeps the state, which stays meaningful.

// fingerprints is what checkStateFingerprints found to do: the stages whose state to delete, and
// the fingerprints to record.
type fingerprints struct {
	reset  []*node
	record []fingerprintRecord
}

// fingerprintRecord is the fingerprint of a stage's state, to record.
type fingerprintRecord struct {
	n                  *node
	fingerprint, shape string
}

// checkStateFingerprints checks the fingerprints of the stateful stages among nodes (see above),
// and returns what to do (applyFingerprints), once the nodes' old definitions no longer run. A
// refusal is a *ConfigError naming every refused stage.
func (sc *stateCheck) checkStateFingerprints(ctx context.Context, resetState []string) (*fingerprints, error) {
	var refused []string
	f := &fingerprints{}
	for _, n := range sc.nodes {
		if !n.stateful {
			continue
		}
		shape, ok := sc.plan.StateShapes[n.name]
		if !ok {
			continue // a stage without a block of its own, whose shape the compiler knows not
		}
		fingerprint := flow.StateFingerprint(shape)
		was, wasShape, found, err := sc.rdb.RecordedFingerprint(ctx, sc.keys.StateFingerprint(n.input.Name, n.name))
		if err != nil {
			return nil, fmt.Errorf("stage %s: %w", n.name, err)
		}
		switch {
		case found && was == fingerprint:
			continue
		case found && slices.Contains(resetState, n.name):
			f.reset = append(f.reset, n)
			sc.log.Warn("the state of a stateful stage whose definition changed is deleted (--reset-state)",
				slog.String("stage", n.name), slog.String("was", oneLine(wasShape)), slog.String("now", oneLine(shape)))
		case found:
			refused = append(refused, fmt.Sprintf("stage %s%s keeps state for another definition: it was %s; it is %s now",
				n.name, sc.where(n), oneLine(wasShape), oneLine(shape)))
			continue
		}
		f.record = append(f.record, fingerprintRecord{n, fingerprint, shape})
	}
	if len(refused) > 0 {
		return nil, &ConfigError{strings.Join(refused, "; ") + ". Its state would not mean what the new definition reads it as. " +
			"Either undo the change; or run with --reset-state=NAME, which deletes the stage's state " +
			"(open windows, remembered keys) before it starts again; or delete it with flowrun reset PATH --stage NAME"}
	}
	return f, nil
}

// applyFingerprints deletes the state that checkStateFingerprints found to delete, and records the
// new fingerprints. It returns the names of the stages whose state it deleted.
func (sc *stateCheck) applyFingerprints(ctx context.Context, f *fingerprints) ([]string, error) {
	var reset []string
	for _, n := range f.reset {
		if err := sc.deleteState(ctx, n); err != nil {
			return reset, err
		}
		reset = append(reset, n.name)
	}
	for _, rec := range f.record {
		if err := sc.rdb.RecordFingerprint(ctx, sc.keys.StateFingerprint(rec.n.input.Name, rec.n.name), rec.fingerprint, rec.shape); err != nil {
			return reset, fmt.Errorf("stage %s: %w", rec.n.name, err)
		}
	}
	return reset, nil
}

// deleteState deletes a stateful stage's state on every partition of its input: state hashes,
// timers and holds. The messages waiting for retries are not state, and stay.
func (sc *stateCheck) deleteState(ctx context.Context, n *node) error {
	var keys []string
	for p := range n.input.Partitions {
		keys = append(keys, sc.keys.State(n.input.Name, p, n.name), sc.keys.Timers(n.input.Name, p, n.name),
			sc.keys.Holds(n.input.Name, p, n.name))
	}
	if _, err := sc.rdb.DeleteKeys(ctx, keys...); err != nil {
		return fmt.Errorf("stage %s: deleting its state: %w", n.name, err)
	}
	return nil
}

// where says where a stage is declared, " (at FILE:LINE)", or nothing.
func (sc *stateCheck) where(n *node) string {
	if n.stage == nil || n.stage.Range.Filename == "" {
		return ""
	}
	return fmt.Sprintf(" (%s:%d)", n.stage.Range.Filename, n.stage.Range.Start.Line)
}

// oneLine puts a state shape on one line, its parts separated by semicolons.
func oneLine(shape string) string { return strings.ReplaceAll(shape, "\n", "; ") }
