package runtime

import (
	"context"
	"log/slog"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// trimmer trims the topics with a retention block (the runner starts it when a topic has one).
type trimmer struct {
	rdb   *redis.Client
	plan  *flow.Plan
	keys  redis.Keys
	clock stages.Clock
	log   *slog.Logger
	every time.Duration // Options.TrimInterval
}

// run trims the streams of topics with a retention block on a timer. Trimming never removes an
// entry that a consumer group has not yet read or acknowledged (transport/redis Trim), so every
// process can do it without coordination. The groups of every reader of a topic are created first,
// in whichever process trims: a reader that has not started yet must not lose what was written for
// it.
func (tr *trimmer) run(ctx context.Context) {
	ticker := tr.clock.NewTicker(tr.every)
	defer ticker.Stop()
	readers := readers(tr.plan)
	grouped := map[string]bool{}
	for {
		for _, t := range tr.plan.Topics {
			if t.Retention.MaxLen == 0 && t.Retention.MaxAge == 0 {
				continue
			}
			for p := 0; p < t.Partitions && ctx.Err() == nil; p++ {
				stream := tr.keys.Stream(t.Name, p)
				if !grouped[stream] {
					if err := tr.ensureGroups(ctx, stream, readers[t.Name]); err != nil {
						if ctx.Err() == nil { // a stop cancels the call: nothing to say
							tr.log.Warn("creating the readers' groups failed; not trimming", "stream", stream, "err", err)
						}
						continue
					}
					grouped[stream] = true
				}
				res, err := tr.rdb.Trim(ctx, stream, redis.Retention{MaxLen: t.Retention.MaxLen, MaxAge: t.Retention.MaxAge}, tr.clock.Now())
				switch {
				case err != nil && ctx.Err() == nil:
					tr.log.Warn("trimming failed", "stream", stream, "err", err)
				case res.Clamped:
					tr.log.Debug("trimmed; a slow consumer group holds entries past the retention", "stream", stream,
						"trimmed", res.Trimmed, "floor", res.Floor)
				case res.Trimmed > 0:
					tr.log.Debug("trimmed", "stream", stream, "trimmed", res.Trimmed)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// readers lists the consumer groups that read each topic, across the whole plan.
func readers(plan *flow.Plan) map[string][]string {
	out := map[string][]string{}
	for _, s := range plan.Stages {
		if s.Input != nil {
			out[s.Input.Name] = append(out[s.Input.Name], redis.Group(s.Name))
		}
	}
	for _, s := range plan.Sinks {
		if s.Input != nil {
			out[s.Input.Name] = append(out[s.Input.Name], redis.Group(s.Name))
		}
	}
	return out
}

func (tr *trimmer) ensureGroups(ctx context.Context, stream string, groups []string) error {
	for _, g := range groups {
		if err := tr.rdb.EnsureGroup(ctx, stream, g); err != nil {
			return err
		}
	}
	return nil
}

// hasRetention reports whether any topic of the plan is trimmed.
func hasRetention(plan *flow.Plan) bool {
	for _, t := range plan.Topics {
		if t.Retention.MaxLen > 0 || t.Retention.MaxAge > 0 {
			return true
		}
	}
	return false
}
