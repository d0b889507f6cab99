package cmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/runtime/admin"
)

func newInspectCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var conn redisFlags
	var asJSON, state bool
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
			"reads; it changes nothing.\n\nWith --state it shows instead, per stateful stage (dedupe, aggregate, a go stage " +
			"whose function is stateful) and partition, " +
			"the watermark (the latest event time the stage saw there), the keys it remembers, its timers and " +
			"the memory they use. The JSON report always has them, in state.",
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
			report, err := admin.Inspect(c.Context(), client.Client(), plan, time.Now())
			if err != nil {
				return exitError{code: ExitError, message: oneLine(err.Error())}
			}
			if asJSON {
				enc := json.NewEncoder(stdio.Out)
				enc.SetIndent("", "  ")
				err = enc.Encode(report)
			} else if state {
				err = writeStateTable(stdio.Out, report)
			} else {
				err = writeInspectTable(stdio.Out, report)
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
	c.Flags().BoolVar(&state, "state", false, "show the state of the stateful stages per partition: watermark, keys (of max_keys), timers, memory")
	return c
}

// writeStateTable prints the stateful stages' state, a line per partition.
func writeStateTable(out io.Writer, r *admin.Report) error {
	if len(r.State) == 0 {
		_, err := fmt.Fprintf(out, "pipeline %s has no stateful stage\n", r.Pipeline)
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	pr := &printer{w: tw}
	pr.println("STAGE\tKIND\tPARTITION\tWATERMARK\tKEYS\tTIMERS\tNEXT TIMER\tMEMORY")
	for _, s := range r.State {
		memory := "?"
		if s.Bytes >= 0 {
			memory = strconv.FormatInt(s.Bytes, 10) + " B"
		}
		keys := strconv.FormatInt(s.Keys, 10)
		if s.MaxKeys > 0 {
			keys += " of " + strconv.FormatInt(s.MaxKeys, 10) // max_keys
		}
		pr.printf("%s\t%s\t%s[%d]\t%s\t%s\t%d\t%s\t%s\n", s.Stage, s.Kind, s.Topic, s.Partition,
			orDash(s.Watermark), keys, s.Timers, orDash(s.NextTimer), memory)
	}
	if pr.err != nil {
		return pr.err
	}
	return tw.Flush()
}

// writeInspectTable prints the report as tables: processes, sources, partitions, consumer groups,
// readers.
func writeInspectTable(out io.Writer, r *admin.Report) error {
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	pr := &printer{w: tw}
	pr.printf("pipeline %s (key prefix %s) on %s\n", r.Pipeline, r.KeyPrefix, r.Redis)
	if r.Description != "" {
		pr.printf("%s\n", r.Description)
	}

	pr.println()
	if len(r.Processes) == 0 {
		pr.println("no flowrun process is running this pipeline")
	} else {
		pr.println("PROCESS\tMEMBERSHIP LAPSES IN\tLEASES")
		for _, p := range r.Processes {
			pr.printf("%s\t%s\t%d\n", p.ID, shortDuration(time.Duration(p.ExpiresInMS)*time.Millisecond), p.Leases)
		}
	}

	if len(r.Sources) > 0 {
		pr.println()
		pr.println("SOURCE\tKIND\tOUTPUT\tLEASE\tUPSTREAM LAG\tNOTE")
		for _, s := range r.Sources {
			lease, note := leaseText(s.Lease, s.LeaseError), ""
			switch {
			case s.LeaseKey == "":
				lease, note = "-", "every process runs it"
			case s.LeaseError != "":
				note = "lease: " + s.LeaseError
			}
			upstream := "-"
			if u := s.Upstream; u != nil {
				upstream = fmt.Sprintf("%d (%s ago)", u.Lag, shortDuration(time.Duration(u.AgeMS)*time.Millisecond))
			}
			pr.printf("source.%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, orDash(s.Output), lease, upstream, note)
		}
	}

	var inputs []admin.SourceReport
	for _, s := range r.Sources {
		if s.Input != nil {
			inputs = append(inputs, s)
		}
	}
	if len(inputs) > 0 {
		pr.println()
		pr.println("SOURCE\tSTREAM\tLENGTH\tGROUP\tLAG\tPENDING\tCONSUMERS\tOLDEST PENDING\tNOTE")
		for _, s := range inputs {
			in, g := s.Input, s.Input.Group
			if !g.Exists {
				note := "no consumer group yet"
				if !in.Exists {
					note = "no stream yet"
				}
				pr.printf("source.%s\t%s\t%d\t%s\t-\t-\t-\t-\t%s\n", s.Name, in.Stream, in.Length, g.Group, note)
				continue
			}
			oldest := "-"
			if g.OldestPendingID != "" {
				oldest = shortDuration(time.Duration(g.OldestPendingAgeMS) * time.Millisecond)
			}
			pr.printf("source.%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t\n", s.Name, in.Stream, in.Length, g.Group,
				lagText(g.Lag, g.LagExact), g.Pending, g.Consumers, oldest)
		}
	}

	pr.println()
	pr.println("TOPIC\tPARTITION\tLENGTH\tFIRST ID\tLAST ID")
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			pr.printf("%s\t%d\t%d\t%s\t%s\n", t.Name, p.Partition, p.Length, orDash(p.FirstID), orDash(p.LastID))
		}
	}

	pr.println()
	pr.println("GROUP\tTOPIC\tPARTITION\tLAG\tPENDING\tCONSUMERS\tOLDEST PENDING\tDELIVERIES\tLEASE\tNOTE")
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
					why := "no consumer group yet "
					if t.Fused != "" {
						why = "fused in " + t.Fused + ": messages pass in memory "
					}
					note = strings.TrimSpace(why + note)
					pr.printf("%s\t%s\t%d\t-\t-\t-\t-\t-\t%s\t%s\n", name, t.Name, p.Partition, leaseText(g.Lease, g.LeaseError), note)
					continue
				}
				oldest, deliveries := "-", "-"
				if g.OldestPendingID != "" {
					oldest = shortDuration(time.Duration(g.OldestPendingAgeMS) * time.Millisecond)
					deliveries = strconv.FormatInt(g.OldestPendingDeliveries, 10)
				}
				pr.printf("%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", name, t.Name, p.Partition,
					lagText(g.Lag, g.LagExact), g.Pending, g.Consumers, oldest, deliveries, leaseText(g.Lease, g.LeaseError), note)
			}
		}
	}

	pr.println()
	pr.println("READER\tINPUT\tLAG\tPENDING\tRETRIES\tDEAD LETTERS")
	for _, rd := range r.Readers {
		dl := strconv.FormatInt(rd.DeadLetters, 10)
		if rd.DeadLetterTopic != "" {
			dl += " (dead letters go to topic " + rd.DeadLetterTopic + ")"
		}
		pr.printf("%s.%s\t%s\t%s\t%d\t%d\t%s\n", rd.Kind, rd.Name, rd.Input, lagText(rd.Lag, rd.LagExact),
			rd.Pending, rd.ScheduledRetries, dl)
	}
	if pr.err != nil {
		return pr.err
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
func leaseText(l *admin.LeaseReport, readErr string) string {
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
