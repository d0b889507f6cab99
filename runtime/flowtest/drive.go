package flowtest

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"sort"
	"strings"
	"time"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// How the harness tells that the pipeline is idle (see the package doc).
const (
	// settleChecks is how many looks in a row must find nothing moving.
	settleChecks = 4
	// settlePause is the real time between two looks.
	settlePause = 10 * time.Microsecond
	// settleGiveUp bounds one settle: a pipeline that still says it works after it (a bug in the
	// accounting) gets its clock moved anyway, rather than hanging the test.
	settleGiveUp = 5 * time.Second
	// staleFiring is how long a fired timer's unread value counts as a goroutine about to wake up.
	staleFiring = 50 * time.Millisecond
)

// settle returns once the pipeline is idle: everything due at the clock's time is done.
func (h *harness) settle() {
	type mark struct {
		commands int
		changes  uint64
	}
	giveUp := time.Now().Add(settleGiveUp)
	var last mark
	still := 0
	for still < settleChecks {
		goruntime.Gosched()
		time.Sleep(settlePause)
		m := mark{h.server.CommandCount(), h.clock.Changes()}
		busy := h.clock.Undelivered(staleFiring)
		if inc := h.live; inc != nil {
			busy = busy || inc.activity.Working() > 0 || inc.client.InFlight() > 0
		}
		for _, f := range h.feeds {
			busy = busy || f.busy()
		}
		switch {
		case busy || m != last:
			still = 0
		default:
			still++
		}
		last = m
		if time.Now().After(giveUp) {
			var working, inFlight int64
			if inc := h.live; inc != nil {
				working, inFlight = int64(inc.activity.Working()), int64(inc.client.InFlight())
			}
			h.log.Warn("flowtest: the pipeline still works after a long wait; moving the clock anyway",
				"undelivered", h.clock.Undelivered(staleFiring), "working", working, "in_flight", inFlight, "commands", m.commands != last.commands)
			return
		}
	}
}

// errNotDrained says that a step without advance ran into drainLimit.
var errNotDrained = errors.New("the pipeline did not drain")

// advance runs the pipeline for d of virtual time (d > 0), or until it is drained (d == 0),
// sending each message of sends when its time comes.
func (h *harness) advance(ctx context.Context, d time.Duration, sends []timedSend) error {
	start := h.clock.Now()
	end := start.Add(d)
	if d == 0 {
		end = start.Add(drainLimit)
	}
	sort.SliceStable(sends, func(i, j int) bool { return sends[i].at < sends[j].at })
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h.settle()
		if err := h.failed(); err != nil {
			return err
		}
		now := h.clock.Now()
		if len(sends) > 0 && !start.Add(sends[0].at).After(now) {
			n := 1
			for n < len(sends) && sends[n].at == sends[0].at {
				n++
			}
			if err := h.send(ctx, sends[:n]); err != nil {
				return err
			}
			sends = sends[n:]
			continue
		}
		if len(sends) == 0 {
			if d > 0 && !now.Before(end) {
				return nil
			}
			if d == 0 {
				waiting, err := h.waiting(ctx)
				if err != nil {
					return err
				}
				if waiting == "" {
					return nil
				}
				if !now.Before(end) {
					return fmt.Errorf("%w within %s of virtual time: %s; give the step an advance, or look at the retry policies",
						errNotDrained, drainLimit, waiting)
				}
			}
		}
		next, ok := h.clock.Next()
		if len(sends) > 0 && (!ok || start.Add(sends[0].at).Before(next)) {
			next, ok = start.Add(sends[0].at), true
		}
		if !ok || next.After(end) {
			next = end
		}
		h.log.Debug("flowtest: the pipeline is idle; the clock moves on", "by", next.Sub(now), "to", next.Sub(Epoch))
		h.clock.AdvanceTo(next)
	}
}

// failed returns the error the running pipeline stopped with, if it stopped.
func (h *harness) failed() error {
	select {
	case <-h.live.done:
		if h.live.err != nil {
			return fmt.Errorf("the pipeline stopped: %w", h.live.err)
		}
		return errors.New("the pipeline stopped")
	default:
		return nil
	}
}

// waiting describes what the pipeline still has to do ("" when it is drained): entries of a
// stage's or sink's input not yet read or not yet acknowledged, and retries waiting in Redis.
func (h *harness) waiting(ctx context.Context) (string, error) {
	c := h.live.client
	keys := redis.Keys{Prefix: h.plan.KeyPrefix}
	var left []string
	for _, s := range h.live.rt.Snapshot().Sources {
		if n := h.feeds[s.Name].queued(); n > 0 {
			left = append(left, fmt.Sprintf("source %s has %d messages to produce", s.Name, n))
		}
		if s.Unwritten > 0 {
			left = append(left, fmt.Sprintf("source %s has %d messages to write", s.Name, s.Unwritten))
		}
	}
	for name, src := range h.streamSources {
		st, err := c.StreamStats(ctx, src.Stream)
		if err != nil {
			return "", err
		}
		if g := groupOf(st, src.Group); st.LastID != "" && (g == nil || g.Pending > 0 || g.LastDeliveredID != st.LastID) {
			left = append(left, fmt.Sprintf("source %s has not read all of %s", name, src.Stream))
		}
	}
	consumers := map[string][]string{} // topic name -> groups
	for _, s := range h.plan.Stages {
		consumers[s.Input.Name] = append(consumers[s.Input.Name], s.Name)
	}
	for _, s := range h.plan.Sinks {
		consumers[s.Input.Name] = append(consumers[s.Input.Name], s.Name)
	}
	for _, t := range h.plan.Topics {
		nodes := consumers[t.Name]
		if len(nodes) == 0 {
			continue
		}
		for p, stream := range keys.Streams(t.Name, t.Partitions) {
			st, err := c.StreamStats(ctx, stream)
			if err != nil {
				return "", err
			}
			for _, node := range nodes {
				if st.LastID != "" {
					g := groupOf(st, redis.Group(node))
					switch {
					case g == nil:
						left = append(left, fmt.Sprintf("%s has not read topic.%s[%d] yet", node, t.Name, p))
					case g.Pending > 0:
						left = append(left, fmt.Sprintf("%s has %d unacknowledged entries of topic.%s[%d]", node, g.Pending, t.Name, p))
					case g.LastDeliveredID != st.LastID:
						left = append(left, fmt.Sprintf("%s has not read all of topic.%s[%d]", node, t.Name, p))
					}
				}
				at, found, err := c.NextRetry(ctx, keys.Retry(t.Name, p, node))
				if err != nil {
					return "", err
				}
				if found {
					left = append(left, fmt.Sprintf("%s has retries waiting in topic.%s[%d], the next at +%s",
						node, t.Name, p, at.Sub(h.clock.Now()).Round(time.Millisecond)))
				}
			}
		}
	}
	return strings.Join(left, "; "), nil
}

func groupOf(st redis.StreamInfo, name string) *redis.GroupInfo {
	for i := range st.Groups {
		if st.Groups[i].Name == name {
			return &st.Groups[i]
		}
	}
	return nil
}
