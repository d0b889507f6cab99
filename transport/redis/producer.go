package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Producer defaults and limits.
const (
	// DefaultBatchSize is the default number of XADDs per pipelined flush: 1000, the size raw
	// pipelined writers use, which amortises the round trip to a fraction of a microsecond per
	// entry and stays far below Redis's output-buffer limits. Linger bounds the wait of a batch
	// that does not fill.
	DefaultBatchSize = 1000
	// DefaultLanes is the default number of lanes: batches written at once, over separate
	// connections. Each stream belongs to one lane, so its entries keep their order.
	DefaultLanes = 4
	// DefaultLinger, also the maximum, is how long a partial batch waits for more entries
	// before it is flushed.
	DefaultLinger = time.Millisecond
)

// ErrProducerClosed is returned by Add and Flush after Close.
var ErrProducerClosed = errors.New("redis: producer closed")

// ProducerOptions configure a Producer.
type ProducerOptions struct {
	// BatchSize is the number of entries per pipelined flush; default DefaultBatchSize. The
	// producer buffers at most 2*BatchSize entries: Add blocks when the buffer is full.
	BatchSize int
	// Linger is how long a partial batch waits before it is flushed; default and maximum
	// DefaultLinger (1ms).
	Linger time.Duration
	// Lanes is how many batches may be written at once; default DefaultLanes.
	Lanes int
	// Written, when set, is called after each batch the producer sent, with how many of its
	// entries went to each stream and the batch's error (nil when all were written), from the
	// goroutine that wrote it: callers that account for what is in Redis (backpressure) learn it.
	Written func(counts map[string]int, err error)
}

// Producer appends entries to streams in pipelined batches. Add enqueues; a background
// goroutine per lane flushes when a batch is full or Linger after its first entry, and the lanes
// write at once. A stream always goes through the same lane, so the entries added to a stream by
// one goroutine are written in the order it added them. Errors of background flushes are returned
// by the next Flush (or Close). It is safe for concurrent use.
type Producer struct {
	lanes []*producerLane
}

// producerLane batches the entries of its share of the streams and writes one batch at a time.
type producerLane struct {
	c       *Client
	written func(map[string]int, error)
	batch   int
	linger  time.Duration
	in      chan produceItem
	stop    chan struct{} // closed by Close once no Add or Flush can send any more
	done    chan struct{} // closed by the flusher when it has exited

	closing   chan struct{} // closed at the start of Close: wakes blocked senders
	closeOnce sync.Once
	mu        sync.RWMutex // senders hold it shared while they send; Close takes it to stop them
	closed    bool
	closeErr  error // the flusher's last error report, valid after done
}

// produceItem is an encoded entry to write, or a flush request when reply is set.
type produceItem struct {
	stream string
	values []any
	off    *offloaded // the payload, when it goes under its own key (see offload.go)
	reply  chan error
}

// NewProducer starts a producer. Close it to stop its goroutines.
func (c *Client) NewProducer(opts ProducerOptions) (*Producer, error) {
	if opts.Lanes < 0 {
		return nil, fmt.Errorf("redis: producer lanes %d is negative", opts.Lanes)
	}
	if opts.Lanes == 0 {
		opts.Lanes = DefaultLanes
	}
	if opts.BatchSize < 0 {
		return nil, fmt.Errorf("redis: producer batch size %d is negative", opts.BatchSize)
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.Linger < 0 || opts.Linger > DefaultLinger {
		return nil, fmt.Errorf("redis: producer linger %s is outside [0, %s]", opts.Linger, DefaultLinger)
	}
	if opts.Linger == 0 {
		opts.Linger = DefaultLinger
	}
	p := &Producer{}
	for range opts.Lanes {
		l := &producerLane{
			c:       c,
			written: opts.Written,
			batch:   opts.BatchSize,
			linger:  opts.Linger,
			in:      make(chan produceItem, 2*opts.BatchSize),
			stop:    make(chan struct{}),
			done:    make(chan struct{}),
			closing: make(chan struct{}),
		}
		go l.run()
		p.lanes = append(p.lanes, l)
	}
	return p, nil
}

// Add enqueues an entry for stream. It returns at once unless its lane's buffer is full, in which
// case it waits for room (backpressure), for ctx, or for Close. Add does not report write errors:
// Flush does.
func (p *Producer) Add(ctx context.Context, stream string, e Entry) error {
	values, err := EncodeEntry(e)
	if err != nil {
		return err
	}
	l := p.lane(stream)
	off := l.c.offload(stream, &Output{}, values)
	return l.send(ctx, produceItem{stream: stream, values: values, off: off})
}

// lane returns the lane of a stream.
func (p *Producer) lane(stream string) *producerLane {
	if len(p.lanes) == 1 {
		return p.lanes[0]
	}
	return p.lanes[Partition(stream, len(p.lanes))]
}

// Flush waits until every entry added before it has been written, and returns the first error
// of the writes since the previous Flush (nil if there was none).
func (p *Producer) Flush(ctx context.Context) error {
	var first error
	for _, l := range p.lanes {
		if err := l.flush(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Close writes what was added, stops the producer and returns the first write error since the
// last Flush. Adds blocked at that moment fail with ErrProducerClosed, as do Add and Flush
// afterwards. If ctx ends first, Close returns its error and the producer finishes writing in
// the background (bounded by the client's timeouts).
func (p *Producer) Close(ctx context.Context) error {
	var first error
	for _, l := range p.lanes {
		if err := l.close(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (p *producerLane) send(ctx context.Context, it produceItem) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrProducerClosed
	}
	select {
	case p.in <- it:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closing:
		return ErrProducerClosed
	}
}

// flush waits until the lane has written every entry added before it.
func (p *producerLane) flush(ctx context.Context) error {
	reply := make(chan error, 1)
	if err := p.send(ctx, produceItem{reply: reply}); err != nil {
		return err
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close writes what the lane holds and stops it.
func (p *producerLane) close(ctx context.Context) error {
	first := false
	p.closeOnce.Do(func() {
		first = true
		close(p.closing)
		p.mu.Lock() // waits for senders, which the closed channel has released
		p.closed = true
		p.mu.Unlock()
		close(p.stop)
	})
	if !first {
		return ErrProducerClosed
	}
	select {
	case <-p.done:
		return p.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run is the lane's flusher goroutine.
func (p *producerLane) run() {
	defer close(p.done)
	pending := make([]produceItem, 0, p.batch)
	var firstErr error
	timer := p.c.newTimer(time.Hour)
	timer.Stop()
	timerOn := false
	flush := func() {
		if timerOn {
			timer.Stop()
			timerOn = false
		}
		if len(pending) == 0 {
			return
		}
		if err := p.write(pending); err != nil && firstErr == nil {
			firstErr = err
		}
		clear(pending)
		pending = pending[:0]
	}
	handle := func(it produceItem) {
		if it.reply != nil {
			flush()
			it.reply <- firstErr
			firstErr = nil
			return
		}
		pending = append(pending, it)
		if len(pending) >= p.batch {
			flush()
		} else if !timerOn {
			timer.Reset(p.linger)
			timerOn = true
		}
	}
	for {
		select {
		case it := <-p.in:
			handle(it)
		case <-timer.C():
			timerOn = false
			flush()
		case <-p.stop:
			// Nobody can send any more: take what is buffered, write it, report.
		drain:
			for {
				select {
				case it := <-p.in:
					handle(it)
				default:
					break drain
				}
			}
			flush()
			p.closeErr = firstErr
			return
		}
	}
}

// write sends one batch as a pipeline. The flusher is not tied to any caller's context; the
// client's timeouts bound it.
func (p *producerLane) write(items []produceItem) error {
	pipe := p.c.rdb.Pipeline()
	for _, it := range items {
		appendEntry(context.Background(), pipe, it.stream, it.values, 0, it.off)
	}
	err := execAppends(context.Background(), pipe)
	if p.written != nil {
		counts := map[string]int{}
		for _, it := range items {
			counts[it.stream]++
		}
		p.written(counts, err)
	}
	return err
}

// Append writes outputs in one pipeline (no transaction) and returns once Redis has answered them
// all: what a Producer does in the background, for callers that make their own batches. The
// outputs of a stream are appended in their order in the slice; MaxLen is honoured; DedupKey is not
// supported (effectively-once outputs go through Commit). An output that cannot be encoded fails
// the call before anything is written; if some writes fail, the error says how many and wraps the
// first, and the others are written.
func (c *Client) Append(ctx context.Context, outputs []Output) error {
	pipe := c.rdb.Pipeline()
	for i := range outputs {
		o := &outputs[i]
		if o.DedupKey != "" {
			return fmt.Errorf("redis: Append does not write effectively-once outputs (%s has a DedupKey): use Commit", o.Stream)
		}
		values, err := EncodeEntry(o.Entry)
		if err != nil {
			return fmt.Errorf("redis: output %d, for %s: %w", i, o.Stream, err)
		}
		appendEntry(ctx, pipe, o.Stream, values, o.MaxLen, c.offload(o.Stream, o, values))
	}
	return execAppends(ctx, pipe)
}

// appendEntry adds the XADD of an encoded entry to a pipeline, or, when its payload is offloaded,
// the script that writes the entry and its payload together.
func appendEntry(ctx context.Context, pipe goredis.Pipeliner, stream string, values []any, maxLen int64, off *offloaded) {
	if off != nil {
		offloadScript.Eval(ctx, pipe, []string{stream, off.key}, append([]any{off.body()}, values...)...)
		return
	}
	pipe.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: values, MaxLen: maxLen, Approx: maxLen > 0})
}

// execAppends runs a pipeline of XADDs. go-redis splits it per node on a cluster, each node's part
// in order.
func execAppends(ctx context.Context, pipe goredis.Pipeliner) error {
	cmds, _ := pipe.Exec(ctx)
	var first error
	failed := 0
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			failed++
			if first == nil {
				first = fmt.Errorf("XADD %s: %w", appendedStream(cmd), err)
			}
		}
	}
	if first != nil {
		return fmt.Errorf("redis: %d of %d entries not written: %w", failed, len(cmds), first)
	}
	return nil
}

// appendedStream is the stream of an appendEntry command: XADD's first argument, or the script's
// first key (EVAL script numkeys stream ...).
func appendedStream(cmd goredis.Cmder) any {
	if args := cmd.Args(); len(args) > 3 && cmd.Name() != "xadd" {
		return args[3]
	}
	return cmd.Args()[1]
}
