package runtime

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
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

// The test runs when this process may have just finished something: when its count of work
// (Activity) drops to zero, which follows every commit, and when a producing source ends or a unit
// has closed its windows. Its two checks then run one right after the other: the second starts
// after the first has read every stream, so whatever moved meanwhile changed a stream the second
// reads again. What this process is not told of (another process's work, writers of a
// redis_stream source's stream) is seen by the same test on a slower timer.

// drainFallback is how often job mode checks whether all work is done without being woken.
const drainFallback = 100 * time.Millisecond

// drainWatch is job mode's end test: what this process runs (nodes, units, producing sources),
// the client to read their streams with, the run's failures (its finish) and the closing of a
// job's watermarks, woken through drainKick (runner.kickDrain).
type drainWatch struct {
	*processing // clock, activity, keys, jitter, the dead letters' log
	*failures
	log          *slog.Logger // the runner's
	rdb          *redis.Client
	nodes        []*node
	units        []*unit
	producers    []*producingSource
	closing      *atomic.Bool  // the runner's: the inputs are drained, the watermarks close
	closeSources chan struct{} // closed with closing
	drainKick    chan struct{} // wakes the test: something may have finished
}

// watchDrain ends the run once all work is done.
func (r *drainWatch) watchDrain(ctx context.Context) {
	starts := r.streamSourceStarts(ctx)
	ticker := r.clock.NewTicker(drainFallback)
	defer ticker.Stop()
	previous := ""
	confirm := false // check again at once: the last check was the first to find all done
	for {
		if !confirm {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C():
			case <-r.drainKick:
				if r.activity.Working() > 0 {
					continue // a batch is at work: it wakes the test again when it is done
				}
			}
		}
		state, done, err := r.drainState(ctx, starts)
		confirm = false
		switch {
		case err != nil:
			if ctx.Err() == nil {
				r.log.Debug("checking for the end of the job failed", "err", err)
			}
			previous = ""
		case !done:
			previous = ""
		case r.closing.Load() && !r.allClosed(ctx):
			previous = "" // the watermarks are closing, one hop after another
		case state == previous && !r.closing.Load() && r.timed():
			// The inputs are drained: the watermarks close, from the sources on, and every open
			// window closes and emits what it holds, which is processed before the job ends. Idle
			// readers are woken to see it.
			r.log.Info("the inputs are drained; closing the watermarks and the open windows")
			r.closing.Store(true)
			close(r.closeSources)
			_ = r.rdb.UnblockReads(ctx)
			previous = ""
		case state == previous && r.activity.Working() > 0:
			// The streams are still, but a batch that reads none is at work (an idle partition's
			// watermark moves, its timers fire): it commits before the job ends, and the drop of
			// the work to none wakes the test again.
			r.log.Debug("the streams are drained; waiting for the work in flight to commit")
			previous = ""
		case state == previous:
			// Nothing is logged after this line but the summary: the dead letters held back by the
			// rate limit are counted first (no dead letter can join them now).
			r.deadLetters.flush(r.log, r.pipelinePath, r.clock.Now(), true)
			r.log.Info("all work done")
			r.finish()
			return
		default:
			// A state that keeps changing waits for the next wake-up, so that writers the job
			// does not wait for (appending to a redis_stream source's stream) cannot keep the
			// test busy.
			confirm = previous == ""
			previous = state
		}
	}
}

// timed reports whether this process runs anything that keeps watermarks.
func (r *drainWatch) timed() bool {
	for _, n := range r.nodes {
		if n.timed() {
			return true
		}
	}
	for _, p := range r.producers {
		if p.time != nil {
			return true
		}
	}
	return false
}

// allClosed reports whether everything this process runs that keeps watermarks has closed them,
// whichever process ran it: every unit's close mark and every producing source's marks are set.
func (r *drainWatch) allClosed(ctx context.Context) bool {
	var hashes, fields []string
	for _, u := range r.units {
		if u.node.timed() {
			c := closeMarkOf(r.keys, u)
			hashes, fields = append(hashes, c.Hash), append(fields, c.Field)
		}
	}
	for _, p := range r.producers {
		if p.time != nil && len(p.time.domains) > 0 {
			hashes = append(hashes, p.time.hashes[0])
			fields = append(fields, redis.MarkField(p.time.writer, p.time.domains[0].Name))
		}
	}
	values, err := r.rdb.ReadMarkFields(ctx, hashes, fields)
	if err != nil {
		r.log.Debug("cannot read whether the watermarks have closed", "err", err)
		return false
	}
	for _, v := range values {
		if m, err := redis.ParseMark(v); err != nil || !m.Closed {
			return false
		}
	}
	return true
}

// streamSourceStarts records the last entry of each redis_stream source's stream as the job starts:
// the source is exhausted once its group has read that far.
func (r *drainWatch) streamSourceStarts(ctx context.Context) map[*unit]string {
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
			b.wait(ctx, r.clock, &r.jitter)
		}
	}
	return starts
}

// drainState reports whether all work is done now, with a fingerprint of the streams' state that
// changes whenever anything moves. It reads everything in one round trip.
func (r *drainWatch) drainState(ctx context.Context, starts map[*unit]string) (string, bool, error) {
	for _, p := range r.producers {
		if !p.done.Load() {
			return "", false, nil
		}
	}
	streams := make([]string, 0, len(r.units))
	var retryKeys []string
	seen := map[string]bool{}
	for _, u := range r.units {
		if !seen[u.stream] {
			seen[u.stream] = true
			streams = append(streams, u.stream)
		}
		if u.retryKey != "" {
			retryKeys = append(retryKeys, u.retryKey)
		}
	}
	stats, waiting, err := r.rdb.DrainStats(ctx, streams, retryKeys)
	if err != nil {
		return "", false, err
	}
	var state strings.Builder
	for _, u := range r.units {
		st := stats[u.stream]
		group, ok := st.Groups[u.node.group]
		if !ok || group.Pending > 0 || waiting[u.retryKey] {
			return "", false, nil
		}
		if start, isSource := starts[u]; isSource {
			if start != "" {
				if c, err := redis.CompareIDs(group.LastDeliveredID, start); err != nil || c < 0 {
					return "", false, nil
				}
			}
		} else if st.LastID != "" {
			// Entries after the last one delivered to the group: its lag.
			if c, err := redis.CompareIDs(st.LastID, group.LastDeliveredID); err != nil || c > 0 {
				return "", false, nil
			}
		}
		state.WriteString(u.stream + "|" + u.node.group + "|" + strconv.FormatInt(st.Length, 10) + "|" +
			st.LastID + "|" + group.LastDeliveredID + ";")
	}
	return state.String(), true, nil
}
