package cmd

import (
	"bufio"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/runtime/admin"
)

func newResetCommand(stdio IO) *cobra.Command {
	var (
		pipeline pipelineFlags
		conn     redisFlags
		opts     admin.ResetOptions
		yes      bool
	)
	c := &cobra.Command{
		Use:   "reset PATH",
		Short: "Delete what a pipeline keeps in Redis, to run it again from scratch",
		Long: "reset lists, then deletes, everything the pipeline keeps in Redis under its key_prefix: state, timers, " +
			"holds, scheduled retries, dead letters, leases and their fencing counters, watermarks, effectively-once " +
			"markers, rate limits, source positions and leases, upstream lag, membership; and the consumer groups " +
			"of its stages and sinks on the topics and of its redis_stream sources. Run again, the pipeline starts " +
			"from scratch. See docs/running.md, \"Starting over\".\n\n" +
			"The topics' entries stay unless --topics deletes their streams too. Readers of a topic that the " +
			"pipeline writes itself start at its end (the rerun writes those entries again); readers of a topic " +
			"that only the outside writes read it again from its first entry.\n\n" +
			"--stage NAME deletes only one source's, stage's or sink's keys and groups (not the watermarks and " +
			"membership the nodes share): the stage reads its input again from the first entry.\n\n" +
			"It refuses while a process runs the pipeline (holds one of its leases, or its membership is live), " +
			"naming the process, and deletes nothing. Without --yes it asks for confirmation on the terminal, and " +
			"refuses when standard input is not one. Keys under the prefix whose names flowrun does not write are " +
			"counted and kept. On a Redis Cluster it scans every master.\n\n" +
			"Exit status: 0 reset (or nothing to reset), 1 refused or failed, 2 invalid pipeline or flags.",
		Example: "  flowrun reset pipeline.hcl                # list, then ask\n" +
			"  flowrun reset pipeline.hcl --yes --topics # everything, topics included\n" +
			"  flowrun reset pipeline.hcl --stage totals --yes",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			plan, err := buildPlan(stdio, &pipeline, args[0])
			if err != nil {
				return err
			}
			if err := admin.CheckResetOptions(plan, opts); err != nil {
				return exitError{code: ExitInvalid, message: err.Error()}
			}
			client, closeClient, err := conn.connect(c.Context(), stdio.Err, false)
			if err != nil {
				return err
			}
			defer closeClient()
			r, err := admin.PlanReset(c.Context(), client.Client(), plan, opts, time.Now())
			if err != nil {
				return exitError{code: ExitError, message: plan.Redact(err.Error())}
			}
			if err := printReset(stdio, r, plan.KeyPrefix, client.String()); err != nil {
				return err
			}
			if len(r.Holders) > 0 {
				return exitError{code: ExitError, message: (&admin.RunningError{Pipeline: r.Pipeline, Holders: r.Holders}).Error()}
			}
			if len(r.Items) == 0 {
				return nil
			}
			if !yes {
				if !isTerminal(readerAsWriter(stdio.In)) {
					return exitError{code: ExitInvalid, message: "standard input is not a terminal to confirm on: pass --yes to reset without asking"}
				}
				note(stdio.Err, "Delete these %d items? Type yes to go on: ", len(r.Items))
				answer, _ := bufio.NewReader(stdio.In).ReadString('\n')
				if strings.TrimSpace(answer) != "yes" {
					return exitError{code: ExitError, message: "not reset: the answer was not yes"}
				}
			}
			n, err := r.Apply(c.Context(), time.Now())
			var running *admin.RunningError
			switch {
			case errors.As(err, &running):
				return exitError{code: ExitError, message: err.Error()}
			case err != nil:
				return exitError{code: ExitError, message: plan.Redact(err.Error())}
			}
			_, err = fmt.Fprintf(stdio.Out, "reset %s: removed %d item%s\n", r.Pipeline, n, plural(n))
			return err
		},
	}
	pipeline.register(c)
	conn.register(c)
	c.Flags().StringVar(&opts.Node, "stage", "", "reset only this source's, stage's or sink's keys")
	c.Flags().BoolVar(&opts.Topics, "topics", false, "delete the topics' streams too (not with --stage)")
	c.Flags().BoolVar(&yes, "yes", false, "delete without asking")
	return c
}

// printReset lists what a reset removes, one line per node and kind of item, and what it keeps.
func printReset(stdio IO, r *admin.Reset, prefix, server string) error {
	p := &printer{w: stdio.Out}
	p.printf("pipeline %s, key prefix %s, on %s\n", r.Pipeline, prefix, server)
	if len(r.Items) == 0 {
		p.println("nothing to reset")
	} else {
		type group struct {
			node, what, example string
			count               int
		}
		var groups []*group
		byName := map[string]*group{}
		for _, it := range r.Items {
			name := it.Node + "\x00" + it.What
			g := byName[name]
			if g == nil {
				example := it.Key
				if it.Group != "" {
					example = "group " + it.Group + " on " + it.Key
				}
				g = &group{node: dash(it.Node), what: it.What, example: example}
				byName[name] = g
				groups = append(groups, g)
			}
			g.count++
		}
		// By node, then consumer groups before keys; what the nodes share ("-") comes last.
		sort.SliceStable(groups, func(i, j int) bool {
			a, b := groups[i].node, groups[j].node
			return a != b && (b == "-" || a != "-" && a < b)
		})
		tw := tabwriter.NewWriter(stdio.Out, 0, 0, 2, ' ', 0)
		tp := &printer{w: tw}
		tp.println("NODE\tWHAT\tCOUNT\tFOR EXAMPLE")
		for _, g := range groups {
			tp.printf("%s\t%s\t%d\t%s\n", g.node, g.what, g.count, g.example)
		}
		if tp.err != nil {
			return tp.err
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		p.printf("%d item%s to remove\n", len(r.Items), plural(len(r.Items)))
	}
	if n := len(r.Streams); n > 0 {
		p.printf("kept: %d topic partition%s and their entries (--topics deletes them)\n", n, plural(n))
	}
	if n := len(r.OtherNodes); n > 0 {
		p.printf("kept: %d key%s of the other nodes, or that they share\n", n, plural(n))
	}
	if n := len(r.Unknown); n > 0 {
		p.printf("kept: %d key%s under the prefix that flowrun does not write, such as %s\n", n, plural(n), r.Unknown[0])
	}
	for _, h := range r.Holders {
		p.printf("running: process %s holds %s (%s left)\n", h.Process, h.Key, h.Left.Round(time.Millisecond))
	}
	return p.err
}
