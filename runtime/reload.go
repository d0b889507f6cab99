package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/flowrun/flowrun/flow"
)

// A running pipeline takes a new plan of its files (flowrun run --watch, SIGHUP) without stopping:
// Reload compares the two plans node by node, by each node's identity (its definition as written,
// flow.Plan.Definitions, and what the run derives for it from the rest of the plan: its topics'
// partitions, its fused chain, its watermarks), and then
//
//   - leaves the nodes whose identity is the same alone: their workers, leases and state go on;
//   - stops the workers of the changed and removed nodes, each after the batch it has in flight is
//     committed, releases their leases and closes them (a file sink flushes and closes its file);
//   - starts the changed nodes with their new definitions, and the added nodes, which take their
//     leases at once. A removed node's consumer groups stay, with its dead letters, for
//     flowrun reset.
//
// Everything that could refuse the new plan is checked before anything stops: what a reload does
// not change in a running process (the pipeline's settings, existing topics, tables, sources; see
// diffPlans), the new nodes' kinds, the permissions they need, their stateful stages' partition
// counts and state fingerprints (state_fingerprints.go). A refused reload changes nothing.

// ReloadReport says what a reload did, by node address ("stage.enrich", "sink.out").
type ReloadReport struct {
	Unchanged []string // went on untouched
	Restarted []string // finished their batches in flight, then started again with the new definition
	Started   []string // added to the pipeline
	Stopped   []string // removed from the pipeline: their consumer groups stay, for flowrun reset
	// StateReset names the stateful stages whose state was deleted (Options.ResetState).
	StateReset []string
	// Ended is what each restarted or stopped node did under the definition it ran, up to the reload.
	Ended []NodeSummary
}

// Changed reports whether the reload changed anything.
func (rep *ReloadReport) Changed() bool {
	return len(rep.Restarted)+len(rep.Started)+len(rep.Stopped) > 0
}

// ReloadError is a refused reload: the pipeline goes on as it ran.
type ReloadError struct {
	Problems []string
}

func (e *ReloadError) Error() string {
	return "the reload is refused, and the pipeline goes on as it was: " + strings.Join(e.Problems, "; ")
}

// Reload applies a new plan of the pipeline to the run in progress; see above. It returns once the
// new plan runs (the changed nodes' batches in flight committed, the new nodes started), or a
// *ReloadError when it refused the plan.
func (rt *Runtime) Reload(ctx context.Context, plan *flow.Plan) (*ReloadReport, error) {
	return rt.r.reload(ctx, plan)
}

// errNotRunning refuses a reload before the run started or once it is stopping.
var errNotRunning = errors.New("the pipeline is not running")

func (r *runner) reload(ctx context.Context, plan *flow.Plan) (*ReloadReport, error) {
	r.reloading.Lock()
	defer r.reloading.Unlock()
	if !r.running {
		return nil, errNotRunning
	}
	if r.opts.UntilDrained {
		return nil, &ReloadError{[]string{"a job (--until-drained) is not reloaded: it ends when its work is done"}}
	}
	d := diffPlans(r.plan, plan, r.opts)
	if len(d.problems) > 0 {
		return nil, &ReloadError{d.problems}
	}
	rep := &ReloadReport{Unchanged: d.unchanged, Restarted: d.changed, Started: d.added, Stopped: d.removed}
	if !rep.Changed() {
		return rep, nil
	}
	own := r.own.Load()
	added, addedUnits, err := r.assemble(plan, append(slices.Clone(d.changed), d.added...))
	if err != nil {
		return nil, &ReloadError{[]string{err.Error()}}
	}
	prints, err := r.checkReload(ctx, plan, added, addedUnits)
	if err != nil {
		return nil, err
	}
	if err := r.openAdded(own.ctx, added); err != nil {
		return nil, &ReloadError{[]string{err.Error()}}
	}

	// From here on the reload happens: the old definitions stop, the new ones start, even if the
	// caller gives up (a stop of the process waits for it).
	ctx = context.WithoutCancel(ctx)
	ending := map[string]bool{}
	for _, addr := range append(slices.Clone(d.changed), d.removed...) {
		ending[addr] = true
	}
	var old []*node
	var kept []*node
	for _, n := range r.nodes {
		if ending[n.typ+"."+n.name] {
			old = append(old, n)
		} else {
			kept = append(kept, n)
		}
	}
	var stopping, keptUnits []*unit
	for _, u := range r.units {
		if ending[u.node.typ+"."+u.node.name] {
			stopping = append(stopping, u)
		} else {
			keptUnits = append(keptUnits, u)
		}
	}
	own.stopUnits(stopping)
	for _, n := range old {
		if err := n.close(); err != nil {
			n.log.Error("closing its old definition", "err", err)
		}
	}
	rep.Ended = nodeSummaries(old, &r.obs.deadLetters)
	sc := &stateCheck{rdb: r.rdb, keys: r.keys, log: r.log, plan: plan, nodes: added}
	if rep.StateReset, err = sc.applyFingerprints(ctx, prints); err != nil {
		r.fail(fmt.Errorf("reload: %w", err)) // the old definitions stopped already: the run cannot go on half reloaded
		return rep, err
	}
	nodes := inPlanOrder(plan, append(kept, added...))
	units := append(keptUnits, addedUnits...)
	r.layoutMu.Lock()
	r.plan, r.nodes, r.units = plan, nodes, units
	r.layoutMu.Unlock()
	own.replaceUnits(units, addedUnits)
	r.leaveRemoved(ctx, d.removed)
	r.logReload(rep)
	return rep, nil
}

// assemble makes the nodes of plan named by addrs, with their units, configured and fused as at
// start (newRunner), without touching the nodes that run.
func (r *runner) assemble(plan *flow.Plan, addrs []string) (nodes []*node, units []*unit, err error) {
	want := map[string]bool{}
	for _, a := range addrs {
		want[a] = true
	}
	// The runner's assembly (assemble.go, fusion.go) adds to its plan's nodes and units: it works on
	// empty ones here, out of the readers' sight, and the runner's are put back after.
	r.layoutMu.Lock()
	defer r.layoutMu.Unlock()
	savedPlan, savedNodes, savedUnits := r.plan, r.nodes, r.units
	r.plan, r.nodes, r.units = plan, nil, nil
	defer func() {
		nodes, units = r.nodes, r.units
		r.plan, r.nodes, r.units = savedPlan, savedNodes, savedUnits
	}()
	for _, s := range plan.Stages {
		if want["stage."+s.Name] {
			if err := r.addStage(s); err != nil {
				return nil, nil, err
			}
		}
	}
	for _, s := range plan.Sinks {
		if want["sink."+s.Name] {
			if err := r.addSink(s); err != nil {
				return nil, nil, err
			}
		}
	}
	for _, n := range r.nodes {
		r.configureNode(n, plan)
		if r.opts.MeterProvider != nil {
			setMetricAttrs(n)
		}
	}
	if !r.opts.NoFusion {
		r.fusing().fuse(nil)
	}
	return nil, nil, nil // the deferred function returns the nodes and units made
}

// checkReload checks what the new nodes need of Redis: the permissions, their stateful stages'
// partition counts and fingerprints. It returns the fingerprints to record once the old
// definitions have stopped.
func (r *runner) checkReload(ctx context.Context, plan *flow.Plan, added []*node, units []*unit) (*fingerprints, error) {
	ac := &accessCheck{processing: &r.processing, rdb: r.rdb, plan: plan, nodes: added, units: units,
		backpressure: r.backpressure, resetState: r.opts.ResetState}
	if err := ac.checkAccess(ctx); err != nil {
		return nil, &ReloadError{[]string{err.Error()}}
	}
	sc := &stateCheck{rdb: r.rdb, keys: r.keys, log: r.log, plan: plan, nodes: added}
	if err := sc.checkStatePartitions(ctx); err != nil {
		return nil, &ReloadError{[]string{err.Error()}}
	}
	prints, err := sc.checkStateFingerprints(ctx, r.opts.ResetState)
	if err != nil {
		return nil, &ReloadError{[]string{err.Error()}}
	}
	return prints, nil
}

// openAdded opens the new nodes; when one fails, it closes those it opened.
func (r *runner) openAdded(ctx context.Context, added []*node) error {
	for i, n := range added {
		if err := n.open(ctx); err != nil {
			for _, o := range added[:i] {
				_ = o.close()
			}
			return fmt.Errorf("%s %s: %w", n.typ, n.name, err)
		}
	}
	return nil
}

// leaveRemoved takes this process out of the membership of the removed nodes, so that the other
// processes still running them (on the old definition) count it out at once.
func (r *runner) leaveRemoved(ctx context.Context, removed []string) {
	var keys []string
	for _, addr := range removed {
		_, name, _ := strings.Cut(addr, ".")
		keys = append(keys, r.keys.NodeMembers(name))
	}
	if len(keys) > 0 {
		if err := r.rdb.Leave(ctx, keys, r.opts.ProcessID); err != nil {
			r.log.Warn("leaving the membership of removed nodes failed; the others count this process out once it expires", "err", err)
		}
	}
}

// logReload logs what a reload did.
func (r *runner) logReload(rep *ReloadReport) {
	r.log.Info("reload applied", "restarted", strings.Join(rep.Restarted, ","), "started", strings.Join(rep.Started, ","),
		"stopped", strings.Join(rep.Stopped, ","), "unchanged", len(rep.Unchanged))
	for _, addr := range rep.Stopped {
		_, name, _ := strings.Cut(addr, ".")
		r.log.Info("removed from the pipeline: its consumer groups and dead letters stay in Redis until flowrun reset deletes them",
			"node", addr, "reset", "flowrun reset "+r.opts.PipelinePath+" --stage "+name)
	}
}

// inPlanOrder orders nodes as the plan lists them: sources, stages, sinks.
func inPlanOrder(plan *flow.Plan, nodes []*node) []*node {
	byAddr := map[string]*node{}
	for _, n := range nodes {
		byAddr[n.typ+"."+n.name] = n
	}
	var out []*node
	for _, addr := range planAddrs(plan) {
		if n := byAddr[addr]; n != nil {
			out = append(out, n)
		}
	}
	return out
}

// planAddrs lists the addresses of the plan's nodes: sources, stages, sinks, each in plan order.
func planAddrs(plan *flow.Plan) []string {
	var out []string
	for _, s := range plan.Sources {
		out = append(out, "source."+s.Name)
	}
	for _, s := range plan.Stages {
		out = append(out, "stage."+s.Name)
	}
	for _, s := range plan.Sinks {
		out = append(out, "sink."+s.Name)
	}
	return out
}
