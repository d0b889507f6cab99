package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

func newInspectCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var conn redisFlags
	var asJSON bool
	c := &cobra.Command{
		Use:   "inspect PATH",
		Short: "Show a pipeline's processes, topics, lag, pending entries, dead letters and leases",
		Long: "Inspect compiles a pipeline and reports what Redis holds for it: the flowrun processes running it " +
			"(each renews its membership on a timer; shown with the time until it lapses and the leases it holds); " +
			"per source the process that holds its lease (one process at a time runs a generate, file or " +
			"redis_stream source; every process runs a stdin source), and for a redis_stream source its stream's " +
			"length and its consumer group's lag and pending entries; per topic and partition the stream's " +
			"length and first and last IDs; per stage or sink reading a partition (its consumer group) the lag " +
			"(entries not yet delivered), the pending entries (delivered, not acked), the consumers, the oldest " +
			"pending entry's age and delivery count, scheduled retries and the lease holder; per stage or sink " +
			"the size of its dead-letter stream. Consumer groups that the pipeline does not have are listed too: " +
			"they hold back trimming.\n\n" +
			"A topic or consumer group that does not exist yet (nothing ran) is shown as empty. Inspect only " +
			"reads; it changes nothing.",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			plan, err := buildPlan(stdio, &flags, args[0])
			if err != nil {
				return err
			}
			client, closeRedis, err := conn.connect(c.Context(), stdio.Err, false)
			if err != nil {
				return err
			}
			defer closeRedis()
			report, err := inspect(c.Context(), client, plan, time.Now())
			if err != nil {
				return exitError{code: ExitError, message: oneLine(err.Error())}
			}
			if asJSON {
				enc := json.NewEncoder(stdio.Out)
				enc.SetIndent("", "  ")
				err = enc.Encode(report)
			} else {
				err = report.writeTable(stdio.Out)
			}
			if err != nil {
				return exitError{code: ExitError, message: err.Error()}
			}
			return nil
		},
	}
	flags.register(c)
	conn.register(c)
	c.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return c
}

// inspectReport is inspect's output; its JSON form is documented by the field tags.
type inspectReport struct {
	Pipeline    string        `json:"pipeline"`
	Description string        `json:"description,omitempty"`
	KeyPrefix   string        `json:"key_prefix"`
	Redis       string        `json:"redis"` // the connection, password redacted
	Topics      []topicReport `json:"topics"`
	// Readers are the stages and sinks, each a consumer group on every partition of its input.
	Readers []readerReport `json:"readers"`
	// Processes are the flowrun processes running the pipeline: the members of the pipeline's
	// members set whose membership has not lapsed, the soonest to lapse first.
	Processes []processReport `json:"processes"`
	// Sources are the pipeline's sources with the holders of their leases, in declaration order.
	Sources []sourceReport `json:"sources"`
}

type processReport struct {
	ID string `json:"id"`
	// ExpiresInMS is the time until the membership lapses unless the process renews it, which a
	// running process does several times per lease period.
	ExpiresInMS int64 `json:"expires_in_ms"`
	// Leases counts the leases of this report (partitions of the readers, sources) that it holds.
	Leases int `json:"leases"`
}

type sourceReport struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Output string `json:"output"`
	// LeaseKey is the key of the lease that lets one process at a time run the source; empty
	// for a source that every process runs (stdin).
	LeaseKey   string       `json:"lease_key,omitempty"`
	Lease      *leaseReport `json:"lease,omitempty"` // nil: nobody holds it
	LeaseError string       `json:"lease_error,omitempty"`
	// Input is a redis_stream source's: the stream it reads and its consumer group there.
	Input *sourceInputReport `json:"input,omitempty"`
}

// sourceInputReport is the stream a redis_stream source reads, with the source's consumer group:
// its lag is what the source has not read yet.
type sourceInputReport struct {
	Stream string      `json:"stream"`
	Exists bool        `json:"exists"`
	Length int64       `json:"length"`
	Group  groupReport `json:"group"`
}

type topicReport struct {
	Name       string            `json:"name"`
	Length     int64             `json:"length"` // all partitions
	Partitions []partitionReport `json:"partitions"`
}

type partitionReport struct {
	Partition int    `json:"partition"`
	Stream    string `json:"stream"`
	Exists    bool   `json:"exists"`
	Length    int64  `json:"length"`
	FirstID   string `json:"first_id,omitempty"`
	LastID    string `json:"last_id,omitempty"`
	// Groups are the pipeline's readers of the topic, then any other consumer group of the stream.
	Groups []groupReport `json:"groups"`
}

type groupReport struct {
	Group string `json:"group"`
	// Reader is "stage.NAME" or "sink.NAME"; empty for a group that the pipeline does not have.
	Reader string `json:"reader,omitempty"`
	// Exists is false when the group has not been created yet; every count is then 0.
	Exists    bool  `json:"exists"`
	Lag       int64 `json:"lag"`
	LagExact  bool  `json:"lag_exact"` // false: Lag is a lower bound
	Pending   int64 `json:"pending"`
	Consumers int64 `json:"consumers"`

	LastDeliveredID string `json:"last_delivered_id,omitempty"`
	OldestPendingID string `json:"oldest_pending_id,omitempty"`
	// OldestPendingAgeMS is the time since the oldest pending entry was written (from its ID),
	// OldestPendingIdleMS the time since it was last delivered.
	OldestPendingAgeMS      int64 `json:"oldest_pending_age_ms,omitempty"`
	OldestPendingIdleMS     int64 `json:"oldest_pending_idle_ms,omitempty"`
	OldestPendingDeliveries int64 `json:"oldest_pending_deliveries,omitempty"`

	ScheduledRetries int64        `json:"scheduled_retries"`
	Lease            *leaseReport `json:"lease,omitempty"` // nil: nobody holds the partition
	LeaseError       string       `json:"lease_error,omitempty"`
}

type leaseReport struct {
	Owner string `json:"owner"`
	Token int64  `json:"token"`
	TTLMS int64  `json:"ttl_ms"`
}

type readerReport struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"` // "stage" or "sink"
	Input string `json:"input"`
	// Lag, Pending and ScheduledRetries add up the reader's partitions.
	Lag              int64 `json:"lag"`
	LagExact         bool  `json:"lag_exact"`
	Pending          int64 `json:"pending"`
	ScheduledRetries int64 `json:"scheduled_retries"`
	// DeadLetters is the length of the reader's own dead-letter stream, DeadLetterStream.
	DeadLetters      int64  `json:"dead_letters"`
	DeadLetterStream string `json:"dead_letter_stream"`
	// DeadLetterTopic is the topic the pipeline sends the reader's dead letters to instead, if any.
	DeadLetterTopic string `json:"dead_letter_topic,omitempty"`
}

// reader is a stage or sink: a consumer group on each partition of its input topic.
type reader struct {
	name, kind string
	input      *flow.Topic
	deadLetter *flow.Topic
}

func (r reader) label() string { return r.kind + "." + r.name }

func readersOf(plan *flow.Plan) []reader {
	var rs []reader
	for _, s := range plan.Stages {
		if s.Input != nil {
			rs = append(rs, reader{name: s.Name, kind: "stage", input: s.Input, deadLetter: s.DeadLetter})
		}
	}
	for _, s := range plan.Sinks {
		if s.Input != nil {
			rs = append(rs, reader{name: s.Name, kind: "sink", input: s.Input, deadLetter: s.DeadLetter})
		}
	}
	return rs
}

// inspect gathers the report; now is the time that ages are measured from.
func inspect(ctx context.Context, c *redis.Client, plan *flow.Plan, now time.Time) (*inspectReport, error) {
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	report := &inspectReport{
		Pipeline: plan.Name, Description: plan.Description, KeyPrefix: plan.KeyPrefix, Redis: c.String(),
		Topics: []topicReport{}, Readers: []readerReport{}, Processes: []processReport{}, Sources: []sourceReport{},
	}
	for _, s := range plan.Sources {
		sr := sourceReport{Name: s.Name, Kind: s.Kind}
		if s.Output != nil {
			sr.Output = s.Output.Name
		}
		if key, ok := sourceLeaseKey(keys, s); ok {
			sr.LeaseKey = key
			sr.Lease, sr.LeaseError = leaseOf(ctx, c, key)
		}
		if s.Kind == "redis_stream" {
			in, err := sourceInput(ctx, c, s, now)
			if err != nil {
				return nil, err
			}
			sr.Input = in
		}
		report.Sources = append(report.Sources, sr)
	}
	readers := readersOf(plan)
	totals := make(map[string]*readerReport, len(readers))
	for _, r := range readers {
		rr := readerReport{Name: r.name, Kind: r.kind, Input: r.input.Name, LagExact: true, DeadLetterStream: keys.DeadLetter(r.name)}
		if r.deadLetter != nil {
			rr.DeadLetterTopic = r.deadLetter.Name
		}
		n, err := c.StreamLen(ctx, rr.DeadLetterStream)
		if err != nil {
			return nil, fmt.Errorf("reading the dead letters of %s: %w", r.label(), err)
		}
		rr.DeadLetters = n
		report.Readers = append(report.Readers, rr)
	}
	for i := range report.Readers {
		totals[readers[i].label()] = &report.Readers[i]
	}

	for _, t := range plan.Topics {
		tr := topicReport{Name: t.Name, Partitions: []partitionReport{}}
		for p := 0; p < t.Partitions; p++ {
			info, err := c.StreamStats(ctx, keys.Stream(t.Name, p))
			if err != nil {
				return nil, err
			}
			pr := partitionReport{
				Partition: p, Stream: info.Stream, Exists: info.Exists, Length: info.Length,
				FirstID: info.FirstID, LastID: info.LastID, Groups: []groupReport{},
			}
			tr.Length += info.Length
			seen := map[string]bool{}
			for _, r := range readers {
				if r.input != t {
					continue
				}
				group := redis.Group(r.name)
				seen[group] = true
				gr := groupReport{Group: group, Reader: r.label()}
				for _, g := range info.Groups {
					if g.Name == group {
						gr = groupOf(g, now)
						gr.Reader = r.label()
					}
				}
				if err := partitionState(ctx, c, keys, t.Name, p, r.name, &gr); err != nil {
					return nil, err
				}
				if total := totals[r.label()]; total != nil {
					total.Lag += gr.Lag
					total.LagExact = total.LagExact && (gr.LagExact || !gr.Exists)
					total.Pending += gr.Pending
					total.ScheduledRetries += gr.ScheduledRetries
				}
				pr.Groups = append(pr.Groups, gr)
			}
			for _, g := range info.Groups {
				if !seen[g.Name] {
					pr.Groups = append(pr.Groups, groupOf(g, now))
				}
			}
			tr.Partitions = append(tr.Partitions, pr)
		}
		report.Topics = append(report.Topics, tr)
	}

	members, err := c.Members(ctx, keys.Members())
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		if left := m.Expires.Sub(now); left > 0 {
			report.Processes = append(report.Processes, processReport{
				ID: m.ID, ExpiresInMS: left.Milliseconds(), Leases: report.leasesHeldBy(m.ID),
			})
		}
	}
	return report, nil
}

// sourceLeaseKey returns the key of the lease that a process takes to run source s, as the runtime
// does: a redis_stream source's lease lives in its stream's hash slot (Keys.StreamLease), a stdin
// source has none (every process reads its own standard input), and any other source, which
// produces messages (generate, file), takes Keys.SourceLease.
func sourceLeaseKey(keys redis.Keys, s *flow.Source) (string, bool) {
	switch s.Kind {
	case "stdin":
		return "", false
	case "redis_stream":
		return keys.StreamLease(s.Config.String("stream"), s.Name), true
	}
	return keys.SourceLease(s.Name), true
}

// sourceInput reads a redis_stream source's stream and the source's consumer group on it.
func sourceInput(ctx context.Context, c *redis.Client, s *flow.Source, now time.Time) (*sourceInputReport, error) {
	stream, group := s.Config.String("stream"), s.Config.String("group")
	info, err := c.StreamStats(ctx, stream)
	if err != nil {
		return nil, err
	}
	in := &sourceInputReport{Stream: stream, Exists: info.Exists, Length: info.Length,
		Group: groupReport{Group: group, Reader: "source." + s.Name}}
	for _, g := range info.Groups {
		if g.Name == group {
			in.Group = groupOf(g, now)
			in.Group.Reader = "source." + s.Name
		}
	}
	return in, nil
}

// leaseOf reads who holds the lease at key: nil when nobody does; an unreadable lease is reported,
// not fatal.
func leaseOf(ctx context.Context, c *redis.Client, key string) (*leaseReport, string) {
	l, ttl, held, err := c.LeaseHolder(ctx, key)
	switch {
	case err != nil:
		return nil, oneLine(err.Error())
	case !held:
		return nil, ""
	}
	return &leaseReport{Owner: l.Owner, Token: l.Token, TTLMS: ttl.Milliseconds()}, ""
}

// leasesHeldBy counts the leases of the report that owner holds.
func (r *inspectReport) leasesHeldBy(owner string) int {
	n := 0
	for _, s := range r.Sources {
		if s.Lease != nil && s.Lease.Owner == owner {
			n++
		}
	}
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			for _, g := range p.Groups {
				if g.Lease != nil && g.Lease.Owner == owner {
					n++
				}
			}
		}
	}
	return n
}

// groupOf converts transport's view of an existing group.
func groupOf(g redis.GroupInfo, now time.Time) groupReport {
	gr := groupReport{
		Group: g.Name, Exists: true, Lag: g.Lag, LagExact: g.LagExact, Pending: g.Pending, Consumers: g.Consumers,
		LastDeliveredID: g.LastDeliveredID, OldestPendingID: g.OldestPendingID,
		OldestPendingIdleMS: g.OldestPendingIdle.Milliseconds(), OldestPendingDeliveries: g.OldestPendingDeliveries,
	}
	if g.OldestPendingID != "" {
		gr.OldestPendingAgeMS = max(0, now.UnixMilli()-idMillis(g.OldestPendingID))
	}
	return gr
}

// partitionState adds a reader's scheduled retries and lease on one partition.
func partitionState(ctx context.Context, c *redis.Client, keys redis.Keys, topic string, p int, stage string, gr *groupReport) error {
	n, err := c.ScheduledRetries(ctx, keys.Retry(topic, p, stage))
	if err != nil {
		return err
	}
	gr.ScheduledRetries = n
	gr.Lease, gr.LeaseError = leaseOf(ctx, c, keys.Lease(topic, p, stage))
	return nil
}

// idMillis returns the time part of a stream ID, in Unix milliseconds.
func idMillis(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}

// writeTable prints the report as tables: processes, sources, partitions, consumer groups, readers.
func (r *inspectReport) writeTable(out io.Writer) error {
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "pipeline %s (key prefix %s) on %s\n", r.Pipeline, r.KeyPrefix, r.Redis)
	if r.Description != "" {
		fmt.Fprintf(tw, "%s\n", r.Description)
	}

	fmt.Fprintln(tw)
	if len(r.Processes) == 0 {
		fmt.Fprintln(tw, "no flowrun process is running this pipeline")
	} else {
		fmt.Fprintln(tw, "PROCESS\tMEMBERSHIP LAPSES IN\tLEASES")
		for _, p := range r.Processes {
			fmt.Fprintf(tw, "%s\t%s\t%d\n", p.ID, shortDuration(time.Duration(p.ExpiresInMS)*time.Millisecond), p.Leases)
		}
	}

	if len(r.Sources) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "SOURCE\tKIND\tOUTPUT\tLEASE\tNOTE")
		for _, s := range r.Sources {
			lease, note := leaseText(s.Lease, s.LeaseError), ""
			switch {
			case s.LeaseKey == "":
				lease, note = "-", "every process runs it"
			case s.LeaseError != "":
				note = "lease: " + s.LeaseError
			}
			fmt.Fprintf(tw, "source.%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, orDash(s.Output), lease, note)
		}
	}

	var inputs []sourceReport
	for _, s := range r.Sources {
		if s.Input != nil {
			inputs = append(inputs, s)
		}
	}
	if len(inputs) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "SOURCE\tSTREAM\tLENGTH\tGROUP\tLAG\tPENDING\tCONSUMERS\tOLDEST PENDING\tNOTE")
		for _, s := range inputs {
			in, g := s.Input, s.Input.Group
			if !g.Exists {
				note := "no consumer group yet"
				if !in.Exists {
					note = "no stream yet"
				}
				fmt.Fprintf(tw, "source.%s\t%s\t%d\t%s\t-\t-\t-\t-\t%s\n", s.Name, in.Stream, in.Length, g.Group, note)
				continue
			}
			oldest := "-"
			if g.OldestPendingID != "" {
				oldest = shortDuration(time.Duration(g.OldestPendingAgeMS) * time.Millisecond)
			}
			fmt.Fprintf(tw, "source.%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t\n", s.Name, in.Stream, in.Length, g.Group,
				lagText(g.Lag, g.LagExact), g.Pending, g.Consumers, oldest)
		}
	}

	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tLENGTH\tFIRST ID\tLAST ID")
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", t.Name, p.Partition, p.Length, orDash(p.FirstID), orDash(p.LastID))
		}
	}

	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tLAG\tPENDING\tCONSUMERS\tOLDEST PENDING\tDELIVERIES\tLEASE\tNOTE")
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			for _, g := range p.Groups {
				name, note := g.Reader, ""
				if name == "" {
					name, note = g.Group, "not in this pipeline"
				}
				if g.LeaseError != "" {
					note = strings.TrimSpace(note + " lease: " + g.LeaseError)
				}
				if !g.Exists {
					note = strings.TrimSpace("no consumer group yet " + note)
					fmt.Fprintf(tw, "%s\t%s\t%d\t-\t-\t-\t-\t-\t%s\t%s\n", name, t.Name, p.Partition, leaseText(g.Lease, g.LeaseError), note)
					continue
				}
				oldest, deliveries := "-", "-"
				if g.OldestPendingID != "" {
					oldest = shortDuration(time.Duration(g.OldestPendingAgeMS) * time.Millisecond)
					deliveries = strconv.FormatInt(g.OldestPendingDeliveries, 10)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", name, t.Name, p.Partition,
					lagText(g.Lag, g.LagExact), g.Pending, g.Consumers, oldest, deliveries, leaseText(g.Lease, g.LeaseError), note)
			}
		}
	}

	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "READER\tINPUT\tLAG\tPENDING\tRETRIES\tDEAD LETTERS")
	for _, rd := range r.Readers {
		dl := strconv.FormatInt(rd.DeadLetters, 10)
		if rd.DeadLetterTopic != "" {
			dl += " (dead letters go to topic " + rd.DeadLetterTopic + ")"
		}
		fmt.Fprintf(tw, "%s.%s\t%s\t%s\t%d\t%d\t%s\n", rd.Kind, rd.Name, rd.Input, lagText(rd.Lag, rd.LagExact),
			rd.Pending, rd.ScheduledRetries, dl)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// tabwriter pads a cell that is followed by an empty last one.
	var trimmed bytes.Buffer
	for _, line := range bytes.SplitAfter(table.Bytes(), []byte("\n")) {
		trimmed.Write(bytes.TrimRight(line, " \n"))
		if bytes.HasSuffix(line, []byte("\n")) {
			trimmed.WriteByte('\n')
		}
	}
	_, err := out.Write(trimmed.Bytes())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func lagText(lag int64, exact bool) string {
	if exact {
		return strconv.FormatInt(lag, 10)
	}
	return ">=" + strconv.FormatInt(lag, 10)
}

// leaseText shows a lease's holder, fencing token and time to live.
func leaseText(l *leaseReport, readErr string) string {
	switch {
	case readErr != "":
		return "unreadable"
	case l == nil:
		return "-"
	}
	return fmt.Sprintf("%s#%d (%s left)", l.Owner, l.Token, shortDuration(time.Duration(l.TTLMS)*time.Millisecond))
}

// shortDuration rounds a duration for a table: 1.2s, 3m2s, 5h3m.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
