package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// The harness's own side of every flow: it publishes into the first stream and is the final
// consumer of the last one, identically for the raw hops, flowrun and Watermill.

// pubBatch is the number of XADDs per pipeline of the harness's publishers (as RAW-PUB).
const pubBatch = 1000

// finalGroup is the final consumer's group on the last stream.
const finalGroup = "final"

// entryValues returns the XADD field list of a payload in the given format.
func entryValues(f format, payload []byte) []any {
	if f == formatWatermill {
		// Watermill's unmarshaller needs a message UUID; the phase and number make one.
		return []any{wmUUIDField, string(payload[phaseOffset : seqOffset+seqDigits]), fieldPayload, payload}
	}
	return []any{fieldPayload, payload}
}

// partSep joins the streams of a topic's partitions into one stream argument of publish,
// publishPaced and the consumer: a message goes to the partition its key picks with flowrun's hash,
// and the consumer reads them all.
const partSep = "|"

// partsOf returns the streams a stream argument names (one, or the partitions joined by partSep).
func partsOf(stream string) []string { return strings.Split(stream, partSep) }

// streamFor returns the stream of parts that a payload goes to.
func streamFor(parts []string, payload []byte) string {
	if len(parts) == 1 {
		return parts[0]
	}
	return parts[redis.Partition(string(payload[keyOffset-1:keyOffset+keyDigits]), len(parts))]
}

// publish writes messages first..first+n-1 of a phase to stream in pipelines of pubBatch.
func publish(ctx context.Context, rdb *goredis.Client, stream string, f format, phase byte, first, n int) error {
	buf := make([]byte, pubBatch*payloadSize)
	parts := partsOf(stream)
	pipe := rdb.Pipeline()
	for done := 0; done < n; {
		k := min(pubBatch, n-done)
		now := time.Now().UnixNano()
		for i := range k {
			p := buf[i*payloadSize : (i+1)*payloadSize]
			putPayload(p, now, phase, first+done+i)
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: streamFor(parts, p), Values: entryValues(f, p)})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("publishing to %s: %w", stream, err)
		}
		done += k
	}
	return nil
}

// publishParallel publishes n messages of a phase from g goroutines, each with its own pipeline.
func publishParallel(ctx context.Context, rdb *goredis.Client, stream string, f format, phase byte, n, g int) error {
	return inParallel(n, g, func(first, count int) error {
		return publish(ctx, rdb, stream, f, phase, first, count)
	})
}

// inParallel splits messages 0..n-1 into g runs of consecutive numbers and calls publish for each
// run in its own goroutine; it returns their errors joined.
func inParallel(n, g int, publish func(first, count int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, g)
	per := (n + g - 1) / g
	for i := range g {
		first := i * per
		count := min(per, n-first)
		if count <= 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = publish(first, count)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// publishPaced publishes n messages of a phase at rate messages per second. Whatever is due when
// the publisher wakes up goes in one pipeline, each message stamped when it is queued.
func publishPaced(ctx context.Context, rdb *goredis.Client, stream string, f format, phase byte, n int, rate float64) error {
	interval := time.Duration(float64(time.Second) / rate)
	buf := make([]byte, n*payloadSize) // every message keeps its own bytes until its pipeline ran
	parts := partsOf(stream)
	start := time.Now()
	pipe := rdb.Pipeline()
	for sent := 0; sent < n; {
		due := min(n, int(time.Since(start)/interval)+1)
		if due <= sent {
			time.Sleep(time.Until(start.Add(time.Duration(sent) * interval)))
			continue
		}
		for i := sent; i < due; i++ {
			p := buf[i*payloadSize : (i+1)*payloadSize]
			putPayload(p, time.Now().UnixNano(), phase, i)
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: streamFor(parts, p), Values: entryValues(f, p)})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("publishing to %s: %w", stream, err)
		}
		sent = due
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// consumer is the final consumer: XREADGROUP COUNT 1000 on the last stream, and one XACK per
// batch.
type consumer struct {
	rdb    *goredis.Client
	stream string
}

// create makes the final consumer's group, at the start of the (maybe not yet existing) stream
// (or streams, see partSep).
func (c *consumer) create(ctx context.Context) error {
	for _, stream := range partsOf(c.stream) {
		err := c.rdb.XGroupCreateMkStream(ctx, stream, finalGroup, "0").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return err
		}
	}
	return nil
}

// receive reads until want messages of the phase have arrived or the deadline passes, calling
// on (if not nil) with each one's publish time and the time it was read. Messages of other phases
// (late ones of an earlier phase) are skipped. It returns how many arrived and when the last did.
func (c *consumer) receive(ctx context.Context, want int, phase byte, deadline time.Time, on func(ts int64, at time.Time)) (int, time.Time, error) {
	got := 0
	var last time.Time
	parts := partsOf(c.stream)
	streams := append(parts[:len(parts):len(parts)], parts...)
	for i := len(parts); i < len(streams); i++ {
		streams[i] = ">"
	}
	for got < want {
		if time.Now().After(deadline) {
			return got, last, nil
		}
		res, err := c.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
			Group: finalGroup, Consumer: "c", Streams: streams, Count: 1000, Block: 100 * time.Millisecond,
		}).Result()
		at := time.Now()
		if errors.Is(err, goredis.Nil) {
			continue
		}
		if err != nil {
			return got, last, fmt.Errorf("final consumer on %s: %w", c.stream, err)
		}
		for _, r := range res {
			ids := make([]string, len(r.Messages))
			for i, m := range r.Messages {
				ids[i] = m.ID
				p, _ := m.Values[fieldPayload].(string)
				ts, ph, ok := readPayload(p)
				if !ok {
					return got, last, fmt.Errorf("final consumer on %s: entry %s is not a benchmark message: %v", r.Stream, m.ID, m.Values)
				}
				if ph != phase {
					continue
				}
				got++
				last = at
				if on != nil {
					on(ts, at)
				}
			}
			if len(ids) == 0 {
				continue
			}
			if err := c.rdb.XAck(ctx, r.Stream, finalGroup, ids...).Err(); err != nil {
				return got, last, err
			}
		}
	}
	return got, last, nil
}

// ackPoll is how often the harness asks how many entries a stage has acknowledged: short against
// the second or more that a flat-out phase takes.
const ackPoll = 2 * time.Millisecond

// ackCounter counts the entries of a stream that a consumer group has acknowledged: those it was
// delivered (its entries-read) less those still pending. It is how a flow whose outputs are not one
// per input (an aggregate's) is measured.
type ackCounter struct {
	rdb           *goredis.Client
	stream, group string
}

// acked returns the count; known is false while the stream or the group does not exist yet, or
// Redis has no count of the entries the group read (go-redis reports that as a lag of -1).
func (a *ackCounter) acked(ctx context.Context) (n int, known bool, err error) {
	groups, err := a.rdb.XInfoGroups(ctx, a.stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("reading the groups of %s: %w", a.stream, err)
	}
	for _, g := range groups {
		if g.Name == a.group && g.Lag >= 0 {
			return int(g.EntriesRead - g.Pending), true, nil
		}
	}
	return 0, false, nil
}

// wait polls until want entries have been acknowledged or the deadline passes. It returns how many
// were, and when it first saw that many.
func (a *ackCounter) wait(ctx context.Context, want int, deadline time.Time) (int, time.Time, error) {
	got, known := 0, false
	var last time.Time
	for got < want {
		n, ok, err := a.acked(ctx)
		at := time.Now()
		if err != nil {
			return got, last, err
		}
		known = known || ok
		if n > got {
			got, last = n, at
		}
		if at.After(deadline) {
			if !known {
				return 0, last, fmt.Errorf("group %s of %s: no count of the entries it acknowledged", a.group, a.stream)
			}
			return got, last, nil
		}
		time.Sleep(ackPoll)
	}
	return got, last, nil
}
