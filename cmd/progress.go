package cmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// progressOptions configure showProgress.
type progressOptions struct {
	// Terminal redraws one line in place on Out; otherwise a log line goes to Logger every Interval.
	Terminal bool
	// Out is where the terminal's line is drawn. Make it a *statusLine that the log (and anything
	// else that writes on the terminal) writes through too, so that their lines go above the
	// progress line instead of being glued to it.
	Out    io.Writer
	Logger *slog.Logger
	// Interval between reports: default 200ms on a terminal, 5s in logs.
	Interval time.Duration
}

// showProgress reports a job's progress until ctx ends: the messages its sources produced (of the
// total, when they know it), the rate, the time left, and the work still queued in the stages.
func showProgress(ctx context.Context, rt *runtime.Runtime, o progressOptions) {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
		if o.Terminal {
			o.Interval = 200 * time.Millisecond
		}
	}
	var line *statusLine
	if o.Terminal {
		var ok bool
		if line, ok = o.Out.(*statusLine); !ok {
			line = newStatusLine(o.Out)
		}
	}
	ticker := time.NewTicker(o.Interval)
	defer ticker.Stop()
	var rate rateMeter
	progressOf(rt.Snapshot(), &rate) // the first report's rate is measured from here
	for {
		select {
		case <-ctx.Done():
			if line != nil {
				line.Clear() // leave the line clean for the summary
			}
			return
		case <-ticker.C:
		}
		p := progressOf(rt.Snapshot(), &rate)
		if line != nil {
			line.Set(p.line())
		} else if o.Logger != nil {
			o.Logger.Info("progress", p.attrs()...)
		}
	}
}

// progress is one report.
type progress struct {
	done, total int64 // messages produced by the sources; total 0 when unknown
	rate        float64
	queued      int64 // lag, pending and retries of the stages and sinks
	eta         time.Duration
	// waiting says what holds the job up: Redis failing, nodes paused by a failing downstream,
	// nodes held back by a full topic, lookups waiting for their tables to catch up.
	waiting []string
}

// rateMeter turns a growing count into a smoothed rate.
type rateMeter struct {
	last  int64
	at    time.Time
	value float64
}

func (m *rateMeter) update(n int64, now time.Time) float64 {
	if !m.at.IsZero() {
		if dt := now.Sub(m.at).Seconds(); dt > 0 {
			current := float64(n-m.last) / dt
			if m.value == 0 {
				m.value = current
			} else {
				m.value = 0.7*m.value + 0.3*current
			}
		}
	}
	m.last, m.at = n, now
	return m.value
}

func progressOf(s runtime.Snapshot, m *rateMeter) progress {
	var p progress
	known := true
	for _, src := range s.Sources {
		p.done += src.Produced
		if src.Total > 0 {
			p.total += src.Total
		} else if !src.Done {
			known = false
		}
	}
	if len(s.Sources) == 0 {
		// No producing source (a redis_stream source, say): count what the nodes read.
		for _, n := range s.Nodes {
			p.done += n.In
		}
		known = false
	}
	if !known {
		p.total = 0
	}
	for _, ps := range s.Partitions {
		p.queued += ps.Lag + ps.Pending + ps.Retries
	}
	if !s.RedisFailingSince.IsZero() {
		p.waiting = append(p.waiting, "Redis failing for "+s.Taken.Sub(s.RedisFailingSince).Round(time.Second).String())
	}
	for _, n := range s.Nodes {
		switch {
		case !n.PausedSince.IsZero():
			p.waiting = append(p.waiting, n.Type+"."+n.Name+" paused")
		case n.HeldBackBy != "":
			p.waiting = append(p.waiting, n.Type+"."+n.Name+" held back by topic."+n.HeldBackBy)
		case n.CatchingUp != "":
			p.waiting = append(p.waiting, n.Type+"."+n.Name+" waiting for table."+n.CatchingUp+" to catch up")
		case n.Delaying > 0:
			p.waiting = append(p.waiting, fmt.Sprintf("%s.%s delayed: %d waiting for the rate limit", n.Type, n.Name, n.Delaying))
		}
	}
	p.rate = m.update(p.done, s.Taken)
	if p.total > 0 && p.rate > 0 && p.done < p.total {
		p.eta = time.Duration(float64(p.total-p.done) / p.rate * float64(time.Second))
	}
	return p
}

// line renders a report as a terminal line.
func (p progress) line() string {
	var b strings.Builder
	if p.total > 0 {
		const width = 24
		filled := int(float64(width) * float64(p.done) / float64(p.total))
		filled = min(max(filled, 0), width)
		fmt.Fprintf(&b, "[%s%s] %d/%d %3.0f%%", strings.Repeat("=", filled), strings.Repeat(" ", width-filled),
			p.done, p.total, 100*float64(p.done)/float64(p.total))
	} else {
		fmt.Fprintf(&b, "%d messages", p.done)
	}
	fmt.Fprintf(&b, "  %.0f msg/s", p.rate)
	if p.eta > 0 {
		fmt.Fprintf(&b, "  ETA %s", p.eta.Round(time.Second))
	}
	fmt.Fprintf(&b, "  queued %d", p.queued)
	if len(p.waiting) > 0 {
		b.WriteString("  waiting: " + strings.Join(p.waiting, ", "))
	}
	return b.String()
}

// attrs renders a report as log attributes.
func (p progress) attrs() []any {
	attrs := []any{"produced", p.done, "rate", fmt.Sprintf("%.0f/s", p.rate), "queued", p.queued}
	if p.total > 0 {
		attrs = append(attrs, "total", p.total)
	}
	if p.eta > 0 {
		attrs = append(attrs, "eta", p.eta.Round(time.Second).String())
	}
	if len(p.waiting) > 0 {
		attrs = append(attrs, "waiting", strings.Join(p.waiting, ", "))
	}
	return attrs
}
