package cmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/admin"
)

// errTailCount stops every reader once --count entries are printed.
var errTailCount = admin.ErrStop

func newTailCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var conn redisFlags
	var opts tailOptions
	c := &cobra.Command{
		Use:   "tail PATH TOPIC|stage.NAME",
		Short: "Print a topic's messages as JSON lines",
		Long: "Tail prints the entries of every partition of a topic, one JSON object per line:\n\n" +
			"  {\"partition\":3,\"id\":\"1700000000000-0\",\"key\":\"c-7\",\"payload\":{...},\"headers\":{...}}\n\n" +
			"key, headers and traceparent are left out when the entry has none. An entry that cannot be " +
			"decoded is printed with an \"error\" and its raw \"fields\" instead of a payload.\n\n" +
			"Name the topic, or a stage as stage.NAME to print what it writes, whatever its output topic is " +
			"called (a stage without an output that is read as stage.NAME writes to a topic named NAME.out).\n\n" +
			"Without --follow, tail prints the entries after --from that are in the topic now, merged across " +
			"partitions in ID order (so roughly in the order they were written), and exits. With --follow it " +
			"then waits for new entries until interrupted; each partition's entries stay in order.\n\n" +
			"Tail uses plain XREAD, not a consumer group, so it is invisible to the stages: it changes no lag, " +
			"pending entry or delivery count.",
		Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			if err := opts.validate(); err != nil {
				return err
			}
			plan, err := buildPlan(stdio, &flags, args[0])
			if err != nil {
				return err
			}
			topic, err := readTopicArg(plan, args[1])
			if err != nil {
				return err
			}
			if why := fusedLink(plan, topic); why != "" {
				note(stdio.Err, "flowrun: %s; tail shows what an unfused run wrote there.\n", why)
			}
			client, closeRedis, err := conn.connect(c.Context(), stdio.Err, false)
			if err != nil {
				return err
			}
			defer closeRedis()
			err = tail(c.Context(), client, plan, topic, opts, stdio.Out)
			if err != nil {
				return exitError{code: ExitError, message: fmt.Sprintf("tail %s: %v", topic.Name, err)}
			}
			return nil
		},
	}
	flags.register(c)
	conn.register(c)
	c.Flags().StringVar(&opts.from, "from", "0", "print the entries after this stream ID: 0 for all of them, $ for only "+
		"those written from now on (with --follow), or an ID such as 1700000000000-0 or a Unix time in ms")
	c.Flags().BoolVarP(&opts.follow, "follow", "f", false, "keep printing new entries until interrupted")
	c.Flags().IntVarP(&opts.count, "count", "n", 0, "stop after printing this many entries (0: no limit)")
	return c
}

type tailOptions struct {
	from   string
	follow bool
	count  int
}

func (o tailOptions) validate() error {
	if o.count < 0 {
		return exitError{code: ExitInvalid, message: fmt.Sprintf("--count %d is negative", o.count)}
	}
	if o.from != "$" {
		if !admin.IsStreamID(o.from) {
			return exitError{code: ExitInvalid, message: fmt.Sprintf("--from %q is not a stream ID: use 0, $, <ms> or <ms>-<seq>", o.from)}
		}
	}
	return nil
}

// tail prints the topic's entries to out, as tailOptions say.
func tail(ctx context.Context, conn *admin.Conn, plan *flow.Plan, topic *flow.Topic, opts tailOptions, out io.Writer) error {
	w := &tailWriter{w: bufio.NewWriter(out), limit: opts.count}
	return admin.Tail(ctx, conn.Client(), plan, topic, admin.TailOptions{
		From: opts.from, Follow: opts.follow, Print: w.print, Flush: w.flush,
	})
}

// tailLine is one line of tail's output.
type tailLine struct {
	Partition   int               `json:"partition"`
	ID          string            `json:"id"`
	Key         string            `json:"key,omitempty"`
	Payload     json.RawMessage   `json:"payload,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	TraceParent string            `json:"traceparent,omitempty"`
	TraceState  string            `json:"tracestate,omitempty"`
	// Error and Fields describe an entry that cannot be decoded.
	Error  string            `json:"error,omitempty"`
	Fields map[string]string `json:"fields,omitempty"`
}

// tailWriter prints whole lines from several goroutines and counts them.
type tailWriter struct {
	mu      sync.Mutex
	w       *bufio.Writer
	buf     bytes.Buffer
	limit   int // 0: none
	printed int
}

// print writes one entry as a line. It returns errTailCount once the limit is reached, and
// prints nothing more after that.
func (t *tailWriter) print(partition int, e admin.Entry) error {
	line := tailLine{Partition: partition, ID: e.ID}
	if e.Malformed != "" {
		line.Error, line.Fields = e.Malformed, e.Fields
	} else {
		line.Key, line.Payload, line.Headers = e.Key, e.Payload, e.Headers
		line.TraceParent, line.TraceState = e.TraceParent, e.TraceState
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.limit > 0 && t.printed >= t.limit {
		return errTailCount
	}
	t.buf.Reset()
	enc := json.NewEncoder(&t.buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(line); err != nil {
		// A payload that passed json.Valid always encodes; be safe anyway.
		t.buf.Reset()
		line.Payload, line.Error = nil, "cannot print the entry: "+err.Error()
		_ = json.NewEncoder(&t.buf).Encode(line)
	}
	if _, err := t.w.Write(t.buf.Bytes()); err != nil {
		return err
	}
	t.printed++
	if t.limit > 0 && t.printed >= t.limit {
		return errTailCount
	}
	return nil
}

func (t *tailWriter) flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.w.Flush()
}
