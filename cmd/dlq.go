package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
)

// dlqFlags are the flags of the dlq subcommands.
type dlqFlags struct {
	pipeline pipelineFlags
	conn     redisFlags
	node     string
	ids      []string
	all      bool
	asJSON   bool
	sets     []string // replay --set, as given
	edits    []admin.PayloadEdit
}

func newDLQCommand(stdio IO) *cobra.Command {
	c := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, replay and purge a stage's dead letters",
		Long: "A message that a source, stage or sink gives up on goes to its dead-letter stream (or to the topic " +
			"its dead_letter names) with what failed, where, how often and when. These commands work on the " +
			"dead letters of one node (--stage, which also takes source and sink names).\n\n" +
			"Replay sends dead letters back to that stage alone, through its retry set, to be processed again " +
			"by the running pipeline; no other stage sees them again. Replayed dead letters stay listed, " +
			"marked with the time of the replay, until they are purged.",
	}
	c.AddCommand(
		dlqCommand(stdio, "list PATH", "List the dead letters of a stage", false, runDLQList),
		dlqCommand(stdio, "show PATH", "Show dead letters in full", true, runDLQShow),
		dlqCommand(stdio, "replay PATH", "Send dead letters back to their stage", true, runDLQReplay, replayFlags),
		dlqCommand(stdio, "purge PATH", "Delete dead letters", true, runDLQPurge),
	)
	return c
}

// dlqCommand builds one dlq subcommand; selects says whether it acts on --id or --all.
// more adds the subcommand's own flags.
func dlqCommand(stdio IO, use, short string, selects bool, run func(cmd *cobra.Command, stdio IO, dl *admin.DeadLetters, f *dlqFlags) error,
	more ...func(c *cobra.Command, f *dlqFlags)) *cobra.Command {
	f := &dlqFlags{}
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if selects && len(f.ids) == 0 && !f.all {
				return exitError{code: ExitInvalid, message: "say which dead letters: --id ID (repeatable) or --all"}
			}
			if len(f.ids) > 0 && f.all {
				return exitError{code: ExitInvalid, message: "--id and --all exclude each other"}
			}
			if err := f.parseEdits(stdio); err != nil {
				return err
			}
			plan, err := buildPlan(stdio, &f.pipeline, args[0])
			if err != nil {
				return err
			}
			client, closeClient, err := f.conn.connect(c.Context(), stdio.Err, false)
			if err != nil {
				return err
			}
			defer closeClient()
			dl, err := admin.OpenDeadLetters(client.Client(), plan, f.node)
			if err != nil {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			if err := run(c, stdio, dl, f); err != nil {
				var exit exitError
				if errors.As(err, &exit) {
					return err
				}
				return exitError{code: ExitError, message: plan.Redact(err.Error())}
			}
			return nil
		},
	}
	f.pipeline.register(c)
	f.conn.register(c)
	c.Flags().StringVar(&f.node, "stage", "", "the source, stage or sink whose dead letters to use (required)")
	_ = c.MarkFlagRequired("stage")
	if selects {
		c.Flags().StringArrayVar(&f.ids, "id", nil, "a dead letter's ID, as list prints it (repeatable)")
		c.Flags().BoolVar(&f.all, "all", false, "every dead letter of the stage")
	}
	c.Flags().BoolVar(&f.asJSON, "json", false, "print JSON")
	for _, add := range more {
		add(c, f)
	}
	return c
}

// replayFlags adds replay's --set and says what it does.
func replayFlags(c *cobra.Command, f *dlqFlags) {
	c.Flags().StringArrayVar(&f.sets, "set", nil, "change each payload on the way back, as msg.FIELD = EXPR "+
		"(repeatable), e.g. 'msg.amount = tonumber(msg.amount)'")
	c.Long = "Replay sends dead letters back to the stage that gave them up, and to it alone, through its retry set: " +
		"the running pipeline (or the next run) processes them again.\n\n" +
		"--set msg.FIELD = EXPR fixes each payload on the way back, for messages refused for their content. EXPR " +
		"is an expression over msg with the functions of pipelines, as in a map stage's set; every --set sees the " +
		"payload as it was dead-lettered, and they are made in order. A dead letter that an expression fails for " +
		"is not replayed: it stays a dead letter, and the reason is printed (exit 1). The dead letters keep their " +
		"payload as it was; replayed ones are marked with the time of the replay."
	c.Example = "  flowrun dlq replay pipeline.hcl --stage enrich --all\n" +
		"  flowrun dlq replay pipeline.hcl --stage enrich --id 1700000000000-0 --set 'msg.amount = tonumber(msg.amount)'"
}

// parseEdits compiles the --set edits, or returns an exit-2 error after printing what is wrong.
func (f *dlqFlags) parseEdits(stdio IO) error {
	for _, text := range f.sets {
		e, file, diags := admin.ParsePayloadEdit("--set", text)
		if diags.HasErrors() {
			files := map[string]*hcl.File{}
			if file != nil {
				files[diags[0].Subject.Filename] = file
			}
			printDiagnostics(stdio.Err, diags, files)
			return exitError{code: ExitInvalid, message: fmt.Sprintf("invalid --set %q", text)}
		}
		f.edits = append(f.edits, e)
	}
	return nil
}

// selected returns the dead letters the flags name.
func selected(c *cobra.Command, dl *admin.DeadLetters, f *dlqFlags) ([]runtime.DeadLetter, error) {
	if f.all {
		return dl.List(c.Context())
	}
	var out []runtime.DeadLetter
	for _, id := range f.ids {
		d, err := dl.Get(c.Context(), id)
		if err != nil {
			return nil, exitError{code: ExitError, message: err.Error()}
		}
		out = append(out, d)
	}
	return out, nil
}

func runDLQList(c *cobra.Command, stdio IO, dl *admin.DeadLetters, f *dlqFlags) error {
	list, err := dl.List(c.Context())
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(stdio, dlqJSON(list))
	}
	if len(list) == 0 {
		_, err := fmt.Fprintf(stdio.Out, "no dead letters\n")
		return err
	}
	tw := tabwriter.NewWriter(stdio.Out, 0, 0, 2, ' ', 0)
	p := &printer{w: tw}
	p.println("ID\tFAILED AT\tATTEMPTS\tPARTITION\tKEY\tREPLAYED\tERROR")
	for _, d := range list {
		env := d.Envelope
		errText := env.Error
		if d.Malformed != "" {
			errText = "(unreadable: " + d.Malformed + ")"
		}
		replayed := "-"
		if !d.Replayed.IsZero() {
			replayed = d.Replayed.Local().Format(time.DateTime)
		}
		p.printf("%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.ID, env.LastFailedAt.Local().Format(time.DateTime),
			env.Attempts, env.Partition, dash(env.Key), replayed, truncate(oneLineText(errText), 80))
	}
	if p.err != nil {
		return p.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdio.Out, "%d dead letter%s\n", len(list), plural(len(list)))
	return err
}

func runDLQShow(c *cobra.Command, stdio IO, dl *admin.DeadLetters, f *dlqFlags) error {
	list, err := selected(c, dl, f)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(stdio, dlqJSON(list))
	}
	p := &printer{w: stdio.Out}
	for i, d := range list {
		if i > 0 {
			p.println()
		}
		b, _ := json.MarshalIndent(dlqJSON([]runtime.DeadLetter{d})[0], "", "  ")
		p.printf("%s\n", b)
	}
	return p.err
}

func runDLQReplay(c *cobra.Command, stdio IO, dl *admin.DeadLetters, f *dlqFlags) error {
	ids := f.ids
	if f.all {
		list, err := dl.List(c.Context())
		if err != nil {
			return err
		}
		ids = nil
		for _, d := range list {
			if d.Replayed.IsZero() {
				ids = append(ids, d.ID) // --all replays what was not replayed yet
			}
		}
	}
	res, err := dl.Replay(c.Context(), ids, f.edits...)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(stdio, map[string]any{"replayed": nonNil(res.Replayed), "skipped": res.Skipped})
	}
	for id, why := range res.Skipped {
		note(stdio.Err, "%s: not replayed: %s\n", id, why)
	}
	if _, err := fmt.Fprintf(stdio.Out, "replayed %d dead letter%s to %s\n", len(res.Replayed), plural(len(res.Replayed)), f.node); err != nil {
		return err
	}
	if len(res.Skipped) > 0 {
		return exitError{code: ExitError, message: fmt.Sprintf("%d dead letter%s not replayed", len(res.Skipped), plural(len(res.Skipped)))}
	}
	return nil
}

func runDLQPurge(c *cobra.Command, stdio IO, dl *admin.DeadLetters, f *dlqFlags) error {
	n, err := dl.Purge(c.Context(), f.ids, f.all)
	if f.asJSON && err == nil {
		return writeJSON(stdio, map[string]any{"purged": n})
	}
	_, werr := fmt.Fprintf(stdio.Out, "purged %d dead letter%s\n", n, plural(n))
	if err != nil {
		return err
	}
	return werr
}

// dlqJSON is the JSON form of dead letters.
func dlqJSON(list []runtime.DeadLetter) []map[string]any {
	out := []map[string]any{}
	for _, d := range list {
		m := map[string]any{"id": d.ID, "stream": d.Stream, "envelope": d.Envelope}
		if d.Malformed != "" {
			m["malformed"] = d.Malformed
		}
		if !d.Replayed.IsZero() {
			m["replayed_at"] = d.Replayed
		}
		out = append(out, m)
	}
	return out
}

func writeJSON(stdio IO, v any) error {
	enc := json.NewEncoder(stdio.Out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func oneLineText(s string) string { return strings.Join(strings.Fields(s), " ") }
