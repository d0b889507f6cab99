package runtime

import (
	"context"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// trimLoop trims the streams of topics with a retention block on a timer. Trimming never removes an
// entry that a consumer group has not yet read or acknowledged (transport/redis Trim), so every
// process can do it without coordination. The groups of every reader of a topic are created first,
// in whichever process trims: a reader that has not started yet must not lose what was written for
// it.
func (r *runner) trimLoop(ctx context.Context) {
	ticker := r.clock.NewTicker(r.opts.TrimInterval)
	defer ticker.Stop()
	readers := r.readers()
	grouped := map[string]bool{}
	for {
		for _, t := range r.plan.Topics {
			if t.Retention.MaxLen == 0 && t.Retention.MaxAge == 0 {
				continue
			}
			for p := 0; p < t.Partitions && ctx.Err() == nil; p++ {
				stream := r.keys.Stream(t.Name, p)
				if !grouped[stream] {
					if err := r.ensureGroups(ctx, stream, readers[t.Name]); err != nil {
						if ctx.Err() == nil { // a stop cancels the call: nothing to say
							r.log.Warn("creating the readers' groups failed; not trimming", "stream", stream, "err", err)
						}
						continue
					}
					grouped[stream] = true
				}
				res, err := r.rdb.Trim(ctx, stream, redis.Retention{MaxLen: t.Retention.MaxLen, MaxAge: t.Retention.MaxAge}, r.clock.Now())
				switch {
				case err != nil && ctx.Err() == nil:
					r.log.Warn("trimming failed", "stream", stream, "err", err)
				case res.Clamped:
					r.log.Debug("trimmed; a slow consumer group holds entries past the retention", "stream", stream,
						"trimmed", res.Trimmed, "floor", res.Floor)
				case res.Trimmed > 0:
					r.log.Debug("trimmed", "stream", stream, "trimmed", res.Trimmed)
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
func (r *runner) readers() map[string][]string {
	out := map[string][]string{}
	for _, s := range r.plan.Stages {
		if s.Input != nil {
			out[s.Input.Name] = append(out[s.Input.Name], redis.Group(s.Name))
		}
	}
	for _, s := range r.plan.Sinks {
		if s.Input != nil {
			out[s.Input.Name] = append(out[s.Input.Name], redis.Group(s.Name))
		}
	}
	return out
}

func (r *runner) ensureGroups(ctx context.Context, stream string, groups []string) error {
	for _, g := range groups {
		if err := r.rdb.EnsureGroup(ctx, stream, g); err != nil {
			return err
		}
	}
	return nil
}

// hasRetention reports whether any topic of the plan is trimmed.
func (r *runner) hasRetention() bool {
	for _, t := range r.plan.Topics {
		if t.Retention.MaxLen > 0 || t.Retention.MaxAge > 0 {
			return true
		}
	}
	return false
}
