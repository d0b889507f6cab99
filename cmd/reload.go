package cmd

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
)

// reloader reloads a running service's pipeline (runtime.Runtime.Reload): when its files change
// (--watch, which looks at them every interval), and on SIGHUP. A change that does not compile is
// refused with its diagnostics, as flowrun validate prints them, and the service goes on as it was.
type reloader struct {
	rt       *runtime.Runtime
	flags    *pipelineFlags
	path     string
	noFusion bool
	log      *slog.Logger
	// diagnostics prints a compilation's diagnostics, as the run printed those of its start.
	diagnostics func(*flow.Config, hcl.Diagnostics) (hasErrors bool)
}

// start runs the reloader until ctx ends or the returned function is called, which waits for a
// reload under way.
func (rl *reloader) start(ctx context.Context, watch bool, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rl.run(ctx, watch, interval, hup)
	}()
	return func() {
		signal.Stop(hup)
		cancel()
		<-done
	}
}

// run reloads on each signal from hup, and with watch on each change of the files, until ctx ends.
func (rl *reloader) run(ctx context.Context, watch bool, interval time.Duration, hup <-chan os.Signal) {
	var tick <-chan time.Time
	if watch {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	applied := rl.contents() // what the run started with, or last tried to reload
	seen := applied
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			rl.log.Info("reloading the pipeline (SIGHUP)")
			applied = rl.contents()
			seen = applied
			rl.reload(ctx)
		case <-tick:
			// A change is reloaded once the files have stayed the same for an interval: an editor
			// that writes a file in several steps is not reloaded halfway.
			now := rl.contents()
			if now != applied && now == seen {
				rl.log.Info("the pipeline's files changed: reloading")
				applied = now
				rl.reload(ctx)
			}
			seen = now
		}
	}
}

// contents is a hash of the pipeline's files and variable files, to tell when they change.
func (rl *reloader) contents() string {
	h := sha256.New()
	files, diags := flow.PipelineFiles(rl.path)
	if diags.HasErrors() {
		h.Write([]byte(diags.Error())) // a hash's Write never fails
	}
	for _, f := range slices.Concat(files, rl.flags.varFiles) {
		b, err := os.ReadFile(f)
		h.Write(fmt.Appendf(nil, "%s %d %v\n", f, len(b), err))
		h.Write(b)
	}
	return string(h.Sum(nil))
}

// reload compiles the pipeline again and applies it to the run.
func (rl *reloader) reload(ctx context.Context) {
	plan, cfg, diags := rl.flags.build(rl.path)
	if rl.diagnostics(cfg, diags) {
		rl.log.Error("reload refused: the pipeline has errors (above); it goes on as it was", "errors", len(diags.Errs()))
		return
	}
	if rl.noFusion {
		plan.Unfuse()
	}
	rep, err := rl.rt.Reload(ctx, plan)
	var refused *runtime.ReloadError
	switch {
	case errors.As(err, &refused):
		for _, why := range refused.Problems {
			rl.log.Error("reload refused; the pipeline goes on as it was", "why", plan.Redact(why))
		}
	case err != nil:
		rl.log.Error("reload failed", "err", plan.Redact(err.Error()))
	case !rep.Changed():
		rl.log.Info("reload: no node changed")
	default:
		for _, n := range rep.Ended {
			rl.log.Info("ended with its old definition", "node", n.Type+"."+n.Name, "in", n.In, "out", n.Out,
				"filtered", n.Filtered, "dead_lettered", n.DeadLettered)
		}
	}
}

// checkResetState checks --reset-state against the plan: each name is a stateful stage's.
func checkResetState(plan *flow.Plan, names []string) error {
	for _, name := range names {
		if _, ok := plan.StateShapes[name]; ok {
			continue
		}
		var stateful []string
		for s := range plan.StateShapes {
			stateful = append(stateful, s)
		}
		slices.Sort(stateful)
		what := "none"
		if len(stateful) > 0 {
			what = strings.Join(stateful, ", ")
		}
		return fmt.Errorf("--reset-state %s: pipeline %s has no stateful stage %q (its stateful stages: %s)", name, plan.Name, name, what)
	}
	return nil
}
