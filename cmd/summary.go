package cmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flowrun/flowrun/runtime"
)

// A run's summary for a human (a table) or for a log (a JSON record), from the runtime's Summary.

// deadLetterNote says in one line how many messages a run dead-lettered and where to find them:
// the command that lists them, or, when they do not outlive the process, that they were printed.
func deadLetterNote(s *runtime.Summary) string {
	n := s.DeadLettered()
	note := fmt.Sprintf("%d message%s dead-lettered", n, plural(int(n)))
	var nodes []string
	for _, ns := range s.Nodes {
		if ns.DeadLettered > 0 {
			nodes = append(nodes, ns.Name)
		}
	}
	switch {
	case n == 0:
		return note
	case s.Ephemeral:
		return note + "; the embedded Redis loses them at exit, so they are printed above"
	case len(nodes) == 1:
		return note + "; list them with " + runtime.DeadLetterCommand(s.Path, nodes[0])
	}
	return note + " by " + strings.Join(nodes, ", ") + "; list them with " + runtime.DeadLetterCommand(s.Path, "NAME")
}

// writeSummary prints a run's summary as a table, followed, when messages were dead-lettered, by the first
// reasons per node and the command that lists them (or, when they do not outlive the process, every
// dead letter).
func writeSummary(w io.Writer, s *runtime.Summary) (err error) {
	// One write at the end, not one per cell: standard error is not buffered, and the summary is
	// the last thing a job does.
	bw := bufio.NewWriter(w)
	defer func() {
		if ferr := bw.Flush(); err == nil {
			err = ferr
		}
	}()
	w = bw
	secs := s.Elapsed.Seconds()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// The columns before the bar add up, per node: in = out + filtered + dropped (+ absorbed) +
	// dead-lettered (+ in flight); those after it are no outcomes of a message (docs/running.md).
	// absorbed and in flight show when some node has any.
	var absorbed, inFlight bool
	for _, n := range s.Nodes {
		absorbed = absorbed || n.Absorbed != 0
		inFlight = inFlight || n.InFlight != 0
	}
	header := "node\tkind\tin\tout\tfiltered\tdropped\t"
	if absorbed {
		header += "absorbed\t"
	}
	header += "dead-lettered\t"
	if inFlight {
		header += "in flight\t"
	}
	p := &printer{w: tw}
	p.printf("%s|\twritten\tfailed attempts\tretries\tin/s\t\n", header)
	for _, n := range s.Nodes {
		rate := "-"
		if secs > 0 {
			rate = fmt.Sprintf("%.0f", float64(n.In)/secs)
		}
		row := fmt.Sprintf("%s.%s\t%s\t%d\t%d\t%d\t%d\t", n.Type, n.Name, n.Kind, n.In, n.Out, n.Filtered, n.Dropped)
		if absorbed {
			row += fmt.Sprintf("%d\t", n.Absorbed)
		}
		row += fmt.Sprintf("%d\t", n.DeadLettered)
		if inFlight {
			row += fmt.Sprintf("%d\t", n.InFlight)
		}
		p.printf("%s|\t%d\t%d\t%d\t%s\t\n", row, n.Written, n.FailedAttempts, n.Retries, rate)
	}
	if p.err != nil {
		return p.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b bytes.Buffer
	for _, n := range s.Nodes {
		var found []string
		if n.Duplicates > 0 {
			found = append(found, fmt.Sprintf("%d duplicate%s", n.Duplicates, plural(int(n.Duplicates))))
		}
		if n.Late > 0 {
			found = append(found, fmt.Sprintf("%d late", n.Late))
		}
		if len(found) > 0 {
			// Those it dropped are a column of their own; the rest it routed or dead-lettered.
			dropped := ""
			if n.Dropped > 0 {
				dropped = fmt.Sprintf(" (%d dropped)", n.Dropped)
			}
			fmt.Fprintf(&b, "%s.%s found %s%s\n", n.Type, n.Name, strings.Join(found, " and "), dropped)
		}
	}
	fmt.Fprintf(&b, "elapsed %s; %d dead-lettered\n", s.Elapsed.Round(time.Millisecond), s.DeadLettered())
	if s.DeadLettered() > 0 {
		b.WriteString("\ndead letters by node, with the first reasons:\n")
		for _, n := range s.Nodes {
			if n.DeadLettered == 0 {
				continue
			}
			fmt.Fprintf(&b, "  %s.%s: %d\n", n.Type, n.Name, n.DeadLettered)
			var counted int64
			for _, r := range n.Reasons {
				fmt.Fprintf(&b, "    %dx %s\n", r.Count, joinLines(r.Reason))
				counted += r.Count
			}
			if other := n.DeadLettered - counted; other > 0 {
				fmt.Fprintf(&b, "    %dx other reasons\n", other)
			}
			if !s.Ephemeral {
				fmt.Fprintf(&b, "    list them: %s\n", runtime.DeadLetterCommand(s.Path, n.Name))
			}
		}
	}
	if s.Ephemeral && len(s.DeadLetters) > 0 {
		fmt.Fprintf(&b, "\nthe embedded Redis loses its dead letters when flowrun exits; here are all %d:\n", len(s.DeadLetters))
		for _, dl := range s.DeadLetters {
			b.WriteString("  " + deadLetterLine(dl) + "\n")
		}
	}
	_, err = w.Write(b.Bytes())
	return err
}

// writeSummaryJSON writes a run's summary as one JSON log record, after one record per dead letter when they
// do not outlive the process: the shape of flowrun run's log with --log-format json. It is written
// whatever the log level, as the table is.
func writeSummaryJSON(w io.Writer, s *runtime.Summary) error {
	h := slog.NewJSONHandler(w, nil)
	ctx := context.Background()
	if s.Ephemeral {
		for _, dl := range s.DeadLetters {
			rec := slog.NewRecord(time.Now(), slog.LevelWarn, "dead letter, lost when the embedded Redis exits", 0)
			rec.AddAttrs(deadLetterAttrs(dl)...)
			if err := h.Handle(ctx, rec); err != nil {
				return err
			}
		}
	}
	type nodeJSON struct {
		Node string `json:"node"`
		Type string `json:"type"`
		Kind string `json:"kind"`
		// The outcomes, which add up: in = out + filtered + dropped + absorbed + dead_lettered + in_flight.
		In           int64 `json:"in"`
		Out          int64 `json:"out"`
		Filtered     int64 `json:"filtered"`
		Dropped      int64 `json:"dropped"`
		Absorbed     int64 `json:"absorbed"`
		DeadLettered int64 `json:"dead_lettered"`
		InFlight     int64 `json:"in_flight"`
		// No outcomes of a message.
		Written        int64                      `json:"written"`
		FailedAttempts int64                      `json:"failed_attempts"`
		Retries        int64                      `json:"retries"`
		Late           int64                      `json:"late,omitempty"`
		Duplicates     int64                      `json:"duplicates,omitempty"`
		DelayedSeconds float64                    `json:"delayed_seconds,omitempty"` // a rate limit's waits, in all
		InPerSecond    float64                    `json:"in_per_second"`
		Reasons        []runtime.DeadLetterReason `json:"reasons,omitempty"`
		List           string                     `json:"list,omitempty"` // the command that lists the dead letters
	}
	nodes := make([]nodeJSON, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		nj := nodeJSON{Node: n.Name, Type: n.Type, Kind: n.Kind, In: n.In, Out: n.Out, Filtered: n.Filtered,
			Dropped: n.Dropped, Absorbed: n.Absorbed, DeadLettered: n.DeadLettered, InFlight: n.InFlight,
			Written: n.Written, FailedAttempts: n.FailedAttempts, Retries: n.Retries, Late: n.Late, Duplicates: n.Duplicates,
			Reasons: n.Reasons, DelayedSeconds: math.Round(n.Delayed.Seconds()*1000) / 1000}
		if secs := s.Elapsed.Seconds(); secs > 0 {
			nj.InPerSecond = math.Round(float64(n.In)/secs*10) / 10
		}
		if n.DeadLettered > 0 && !s.Ephemeral {
			nj.List = runtime.DeadLetterCommand(s.Path, n.Name)
		}
		nodes = append(nodes, nj)
	}
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "job summary", 0)
	rec.AddAttrs(slog.Float64("elapsed_seconds", math.Round(s.Elapsed.Seconds()*1000)/1000),
		slog.Int64("dead_lettered", s.DeadLettered()), slog.Any("nodes", nodes))
	if s.Ephemeral {
		rec.AddAttrs(slog.Bool("dead_letters_lost_at_exit", true))
	}
	return h.Handle(ctx, rec)
}

// deadLetterLine shows a dead letter on one line: the node, then key=value pairs.
func deadLetterLine(dl runtime.DeadLetter) string {
	attrs := deadLetterAttrs(dl)
	var b strings.Builder
	b.WriteString(attrs[0].Value.String())
	for _, a := range attrs[1:] {
		b.WriteString(" " + a.Key + "=")
		switch v := a.Value.Any().(type) {
		case json.RawMessage:
			b.Write(v)
		case string:
			b.WriteString(strconv.Quote(v))
		default:
			fmt.Fprint(&b, v)
		}
	}
	return b.String()
}

// deadLetterAttrs describes a dead letter: the node first ("stage.NAME"), then where the message
// was, why it failed and what it carried.
func deadLetterAttrs(dl runtime.DeadLetter) []slog.Attr {
	env := dl.Envelope
	id := env.ID
	if id == "" {
		id = dl.ID // a source's message had no entry of its own
	}
	attrs := []slog.Attr{
		slog.String("node", env.NodeType+"."+env.Node),
		slog.Int("partition", env.Partition), slog.String("id", id), slog.String("key", env.Key),
		slog.Int("attempts", env.Attempts), slog.String("error", joinLines(env.Error)),
	}
	switch {
	case dl.Malformed != "":
		attrs = append(attrs, slog.String("malformed", dl.Malformed))
	case len(env.Payload) > maxPrintedPayload:
		// A line of many megabytes helps nobody: its start says which message it was.
		attrs = append(attrs, slog.String("payload_start", string(env.Payload[:maxPrintedPayload])),
			slog.Int("payload_bytes", len(env.Payload)))
	case len(env.Payload) > 0:
		attrs = append(attrs, slog.Any("payload", compactJSON(env.Payload)))
	case len(env.RawFields) > 0:
		fields, _ := json.Marshal(env.RawFields)
		attrs = append(attrs, slog.Any("fields", json.RawMessage(fields)))
	}
	return attrs
}

// maxPrintedPayload is the most of a payload that a printed dead letter shows.
const maxPrintedPayload = 4 << 10

// compactJSON puts a JSON payload on one line.
func compactJSON(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// joinLines joins the lines of a message with "; " (errors.Join puts each error on a line of its own).
func joinLines(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }), "; ")
}
