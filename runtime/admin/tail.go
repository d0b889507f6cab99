package admin

import (
	"context"
	"errors"
	"time"

	"github.com/sourcegraph/conc/pool"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Tail reads without a consumer group (transport/redis Client.Read, a plain XREAD), so that it
// changes nothing that a stage sees: no group, no pending entry, no delivery count.

const (
	// tailPage is the COUNT of one XREAD.
	tailPage = 1000
	// tailBlock is how long one XREAD of Follow waits before it is sent again. Ending ctx does not
	// wait for it: the client is closed, which ends the blocked reads.
	tailBlock = 5 * time.Second
)

// ErrStop, returned by TailOptions.Print, ends Tail without an error: flowrun tail --count.
var ErrStop = errors.New("stop tailing")

// TailOptions say what Tail reads and where it goes.
type TailOptions struct {
	// From is the stream ID after which to read: "0" for every entry, "$" for only those written
	// from now on (with Follow), or an ID ("<ms>-<seq>" or "<ms>"; see IsStreamID).
	From string
	// Follow keeps reading new entries until ctx ends. The client is closed when it does (a
	// blocked read does not watch its context), so use a client of its own.
	Follow bool
	// Print is given each entry with its partition. Without Follow the entries of all partitions
	// come merged in ID order (roughly the order they were written), from one goroutine; with
	// Follow, new entries come from one goroutine per partition at once, each partition's in order.
	Print func(partition int, e Entry) error
	// Flush, if set, is called when what was printed should be shown: after the entries that were
	// in the topic, after each read of Follow, and at the end.
	Flush func() error
}

// Entry is one entry of a topic as Tail reads it.
type Entry struct {
	ID          string
	Key         string
	Payload     []byte // JSON
	Headers     map[string]string
	TraceParent string
	TraceState  string
	// Malformed says why the entry cannot be decoded ("" when it can); Fields are then its raw
	// fields, and Key, Payload, Headers and the trace context are empty.
	Malformed string
	Fields    map[string]string
}

// IsStreamID reports whether s is a stream ID, "<ms>-<seq>" or "<ms>" (a Unix time in ms).
func IsStreamID(s string) bool {
	_, err := redis.CompareIDs(s, "0")
	return err == nil
}

// tailPrinter hands the records read to the caller's functions.
type tailPrinter struct {
	printFn func(partition int, e Entry) error
	flushFn func() error
}

func (w tailPrinter) print(partition int, r redis.Record) error {
	e := Entry{ID: r.ID}
	if m := r.Malformed; m != nil {
		e.Malformed, e.Fields = m.Reason, m.Fields
	} else {
		e.Key, e.Payload, e.Headers = r.Key, r.Payload, r.Headers
		e.TraceParent, e.TraceState = r.TraceParent, r.TraceState
	}
	return w.printFn(partition, e)
}

func (w tailPrinter) flush() error {
	if w.flushFn == nil {
		return nil
	}
	return w.flushFn()
}

// tailCursor is where tail is in one partition.
type tailCursor struct {
	partition int
	stream    string
	last      string         // the ID after which to read next
	buf       []redis.Record // read and not yet printed, in ID order
	drained   bool           // a read returned nothing: the backlog of the partition is printed
}

// Tail reads the entries of every partition of a topic of the plan and gives them to opts.Print, as
// opts say. Without Follow it returns once the entries now in the topic are given; with Follow it
// returns when ctx ends (without an error: that is how following ends) or when Print or Flush
// fails. Print returning ErrStop ends it without an error.
func Tail(ctx context.Context, c *redis.Client, plan *flow.Plan, topic *flow.Topic, opts TailOptions) error {
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	w := tailPrinter{printFn: opts.Print, flushFn: opts.Flush}
	cursors := make([]*tailCursor, topic.Partitions)
	for p := range cursors {
		cursors[p] = &tailCursor{partition: p, stream: keys.Stream(topic.Name, p), last: opts.From}
		if opts.From == "$" {
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
	if err == nil && opts.Follow {
		if err = w.flush(); err == nil { // show the backlog before waiting for more
			err = tailFollow(ctx, c, cursors, w)
		}
	}
	if errors.Is(err, ErrStop) {
		err = nil
	}
	if ferr := w.flush(); err == nil {
		err = ferr
	}
	if err != nil && opts.Follow && ctx.Err() != nil {
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
func tailBacklog(ctx context.Context, c *redis.Client, cursors []*tailCursor, w tailPrinter) error {
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
func tailFollow(ctx context.Context, c *redis.Client, cursors []*tailCursor, w tailPrinter) error {
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
