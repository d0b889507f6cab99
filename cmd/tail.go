package cmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sourcegraph/conc/pool"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// tail reads without a consumer group (transport/redis Client.Read, a plain XREAD), so that it
// changes nothing that a stage sees: no group, no pending entry, no delivery count.

const (
	// tailPage is the COUNT of one XREAD.
	tailPage = 1000
	// tailBlock is how long one XREAD of --follow waits before it is sent again. Interrupting
	// does not wait for it: the connections are closed, which ends the blocked reads.
	tailBlock = 5 * time.Second
)

// errTailCount stops every reader once --count entries are printed.
var errTailCount = errors.New("count reached")

func newTailCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var conn redisFlags
	var opts tailOptions
	c := &cobra.Command{
		Use:   "tail PATH TOPIC",
		Short: "Print a topic's messages as JSON lines",
		Long: "Tail prints the entries of every partition of a topic, one JSON object per line:\n\n" +
			"  {\"partition\":3,\"id\":\"1700000000000-0\",\"key\":\"c-7\",\"payload\":{...},\"headers\":{...}}\n\n" +
			"key, headers and traceparent are left out when the entry has none. An entry that cannot be " +
			"decoded is printed with an \"error\" and its raw \"fields\" instead of a payload.\n\n" +
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
			topic, err := topicArg(plan, args[1])
			if err != nil {
				return err
			}
			client, closeRedis, err := conn.connect(c.Context(), stdio.Err, false)
			if err != nil {
				return err
			}
			defer closeRedis()
			err = tail(c.Context(), client, redis.Keys{Prefix: plan.KeyPrefix}, topic, opts, stdio.Out)
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
		if _, err := redis.CompareIDs(o.from, "0"); err != nil {
			return exitError{code: ExitInvalid, message: fmt.Sprintf("--from %q is not a stream ID: use 0, $, <ms> or <ms>-<seq>", o.from)}
		}
	}
	return nil
}

// tailCursor is where tail is in one partition.
type tailCursor struct {
	partition int
	stream    string
	last      string         // the ID after which to read next
	buf       []redis.Record // read and not yet printed, in ID order
	drained   bool           // a read returned nothing: the backlog of the partition is printed
}

// tail prints the topic's entries to out, as tailOptions say.
func tail(ctx context.Context, c *redis.Client, keys redis.Keys, topic *flow.Topic, opts tailOptions, out io.Writer) error {
	w := &tailWriter{w: bufio.NewWriter(out), limit: opts.count}
	cursors := make([]*tailCursor, topic.Partitions)
	for p := range cursors {
		cursors[p] = &tailCursor{partition: p, stream: keys.Stream(topic.Name, p), last: opts.from}
		if opts.from == "$" {
			// Resolved once, to the last entry now: XREAD $ in a loop would skip what arrives
			// between two reads.
			last, err := c.LastID(ctx, cursors[p].stream)
			if err != nil {
				return err
			}
			cursors[p].last = last
		}
	}
	err := tailBacklog(ctx, c, cursors, w)
	if err == nil && opts.follow {
		if err = w.flush(); err == nil { // show the backlog before waiting for more
			err = tailFollow(ctx, c, cursors, w)
		}
	}
	if errors.Is(err, errTailCount) {
		err = nil
	}
	if ferr := w.flush(); err == nil {
		err = ferr
	}
	if err != nil && opts.follow && ctx.Err() != nil {
		return nil // interrupted: the normal end of --follow
	}
	return err
}

// read fetches the next page of a partition after cur.last into cur.buf; block <= 0 does not wait.
// A partition that does not exist yet reads as empty.
func (cur *tailCursor) read(ctx context.Context, c *redis.Client, block time.Duration) error {
	recs, err := c.Read(ctx, cur.stream, cur.last, tailPage, block)
	if err != nil {
		return err
	}
	cur.buf = append(cur.buf, recs...)
	if n := len(cur.buf); n > 0 {
		cur.last = cur.buf[n-1].ID
	}
	return nil
}

// tailBacklog prints the entries now in the partitions, merged in ID order. It pages through each
// partition, keeping at most one page per partition in memory.
func tailBacklog(ctx context.Context, c *redis.Client, cursors []*tailCursor, w *tailWriter) error {
	for {
		var next *tailCursor
		for _, cur := range cursors {
			if len(cur.buf) == 0 && !cur.drained {
				if err := cur.read(ctx, c, 0); err != nil {
					return err
				}
				cur.drained = len(cur.buf) == 0
			}
			if len(cur.buf) == 0 {
				continue
			}
			if next == nil || idLess(cur.buf[0].ID, next.buf[0].ID) {
				next = cur
			}
		}
		if next == nil {
			return nil
		}
		if err := w.print(next.partition, next.buf[0]); err != nil {
			return err
		}
		next.buf = next.buf[1:]
	}
}

// idLess compares two stream IDs; an unparsable ID, which Redis never returns, sorts last.
func idLess(a, b string) bool {
	c, err := redis.CompareIDs(a, b)
	return err == nil && c < 0
}

// tailFollow prints new entries of every partition until ctx ends or the count is reached: one
// reader per partition, since partitions live in different cluster slots and one XREAD cannot
// cover them.
func tailFollow(ctx context.Context, c *redis.Client, cursors []*tailCursor, w *tailWriter) error {
	p := pool.New().WithContext(ctx).WithCancelOnError().WithFirstError()
	// A blocked XREAD does not watch its context; closing the connections ends it at once.
	p.Go(func(ctx context.Context) error {
		<-ctx.Done()
		_ = c.Close()
		return nil
	})
	for _, cur := range cursors {
		p.Go(func(ctx context.Context) error {
			for {
				if err := cur.read(ctx, c, tailBlock); err != nil {
					if ctx.Err() != nil {
						return nil // interrupted, or another reader failed or reached the count
					}
					return err
				}
				for _, m := range cur.buf {
					if err := w.print(cur.partition, m); err != nil {
						return err
					}
				}
				cur.buf = cur.buf[:0]
				if err := w.flush(); err != nil {
					return err
				}
			}
		})
	}
	return p.Wait()
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
func (t *tailWriter) print(partition int, r redis.Record) error {
	line := tailLine{Partition: partition, ID: r.ID}
	if m := r.Malformed; m != nil {
		line.Error, line.Fields = m.Reason, m.Fields
	} else {
		line.Key, line.Payload, line.Headers = r.Key, r.Payload, r.Headers
		line.TraceParent, line.TraceState = r.TraceParent, r.TraceState
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
