package runtime

import (
	"context"
	"strconv"
	"strings"
	"time"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// A job is done when every producing source has finished (and flushed), every redis_stream source has
// read all that its stream held when the job started, and every stage and sink of this process has
// nothing left: no lag (entries not yet delivered to its group), nothing pending (delivered, not
// yet acknowledged, which includes messages waiting for a retry in the process) and nothing in its
// retry set. The streams are not read in one
// atomic step, so the test must pass twice in a row with nothing moving in between: only then can no
// message be in flight from one stream to another.

// drainInterval is how often job mode checks whether all work is done.
const drainInterval = 100 * time.Millisecond

// watchDrain ends the run once all work is done.
func (r *runner) watchDrain(ctx context.Context) {
	starts := r.streamSourceStarts(ctx)
	ticker := r.clock.NewTicker(drainInterval)
	defer ticker.Stop()
	previous := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		state, done, err := r.drainState(ctx, starts)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				r.log.Debug("checking for the end of the job failed", "err", err)
			}
			previous = ""
		case !done:
			previous = ""
		case r.closing.Load() && r.closed.Load() < r.timedUnits():
			previous = "" // the stateful stages are closing their windows
		case state == previous && !r.closing.Load() && r.timedUnits() > 0:
			// The inputs are drained: every open window closes now, and what it emits is processed
			// before the job ends.
			r.log.Info("the inputs are drained; closing the open windows")
			r.closing.Store(true)
			previous = ""
		case state == previous:
			r.log.Info("all work done")
			r.finish()
			return
		default:
			previous = state
		}
	}
}

// timedUnits counts the units of stateful stages whose timers fire at the end of a job
// (StageTraits.FireAtEnd) that this process runs.
func (r *runner) timedUnits() int64 {
	var n int64
	for _, u := range r.units {
		if u.node.fireAtEnd {
			n++
		}
	}
	return n
}

// streamSourceStarts records the last entry of each redis_stream source's stream as the job starts:
// the source is exhausted once its group has read that far.
func (r *runner) streamSourceStarts(ctx context.Context) map[*unit]string {
	starts := map[*unit]string{}
	for _, u := range r.units {
		if u.node.typ != "source" {
			continue
		}
		for ctx.Err() == nil {
			st, err := r.rdb.StreamStats(ctx, u.stream)
			if err == nil {
				starts[u] = st.LastID
				break
			}
			if !r.redisFailed("source "+u.node.name+" reading the length of "+u.stream, err) {
				return starts
			}
			var b backoff
			b.wait(ctx, r)
		}
	}
	return starts
}

// drainState reports whether all work is done now, with a fingerprint of the streams' state that
// changes whenever anything moves.
func (r *runner) drainState(ctx context.Context, starts map[*unit]string) (string, bool, error) {
	for _, p := range r.producers {
		if !p.done.Load() {
			return "", false, nil
		}
	}
	var state strings.Builder
	stats := map[string]redis.StreamInfo{}
	for _, u := range r.units {
		st, ok := stats[u.stream]
		if !ok {
			var err error
			if st, err = r.rdb.StreamStats(ctx, u.stream); err != nil {
				return "", false, err
			}
			stats[u.stream] = st
		}
		var group *redis.GroupInfo
		for i := range st.Groups {
			if st.Groups[i].Name == u.node.group {
				group = &st.Groups[i]
			}
		}
		if group == nil || group.Pending > 0 {
			return "", false, nil
		}
		if u.retryKey != "" {
			if _, waiting, err := r.rdb.NextRetry(ctx, u.retryKey); err != nil || waiting {
				return "", false, err
			}
		}
		if start, isSource := starts[u]; isSource {
			if start != "" {
				if c, err := redis.CompareIDs(group.LastDeliveredID, start); err != nil || c < 0 {
					return "", false, nil
				}
			}
		} else if group.Lag > 0 {
			return "", false, nil
		}
		state.WriteString(u.stream + "|" + u.node.group + "|" + strconv.FormatInt(st.Length, 10) + "|" +
			st.LastID + "|" + group.LastDeliveredID + ";")
	}
	return state.String(), true, nil
}
