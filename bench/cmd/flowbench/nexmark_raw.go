package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"
)

// "NEXMARK q0 raw" is query 0 written against go-redis alone: what bench/nexmark/q0.hcl does with
// nothing of flowrun's, so that its per-core figure is the ceiling of q0 through a Redis stream on
// this machine. One process reads the bids file, adds each bid to one of four streams by its
// auction (XADD in pipelines of 1000, as the topic's key does), and meanwhile reads the streams back
// in a consumer group each (XREADGROUP COUNT 1000), writes the payloads to the output file and
// acknowledges them (XACK), ending once every bid is written. It checks no JSON beyond finding the
// auction, keeps no watermark, lease or metric, and fences nothing.

const rawQ0Partitions = 4

func init() {
	scenarios = append(scenarios, scenario{name: "NEXMARK q0 raw", kind: kindNexmark, impl: implRaw, stages: 1, pipeline: "q0"})
}

// rawNexmarkQ0 runs the raw query 0 from the bids file in to the file out.
func rawNexmarkQ0(ctx context.Context, addr, in, out string) error {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	defer func() { _ = rdb.Close() }() // the query is done
	streams := make([]string, rawQ0Partitions)
	for p := range streams {
		streams[p] = fmt.Sprintf("rawq0:{%d}", p)
		if err := rdb.Del(ctx, streams[p]).Err(); err != nil {
			return err
		}
		if err := rdb.XGroupCreateMkStream(ctx, streams[p], "q0", "0").Err(); err != nil {
			return err
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	p := &rawQ0Progress{done: make(chan struct{})}
	p.total.Store(-1)
	var wg sync.WaitGroup
	errs := make(chan error, rawQ0Partitions)
	for _, stream := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rawQ0Consume(ctx, rdb, stream, w, p); err != nil {
				errs <- err
				p.end()
			}
		}()
	}
	n, err := rawQ0Produce(ctx, rdb, in, streams)
	if err != nil {
		p.end()
	} else {
		p.total.Store(n)
		p.check()
	}
	wg.Wait()
	close(errs)
	if err := errors.Join(err, <-errs); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// rawQ0Progress ends the consumers once they wrote every bid the producer added.
type rawQ0Progress struct {
	mu      sync.Mutex // the output's writer
	written atomic.Int64
	total   atomic.Int64 // -1 until the producer is done
	done    chan struct{}
	once    sync.Once
}

func (p *rawQ0Progress) check() {
	if t := p.total.Load(); t >= 0 && p.written.Load() >= t {
		p.end()
	}
}

func (p *rawQ0Progress) end() { p.once.Do(func() { close(p.done) }) }

func rawQ0Produce(ctx context.Context, rdb *goredis.Client, in string, streams []string) (int64, error) {
	f, err := os.Open(in)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	pipe := rdb.Pipeline()
	var n int64
	for sc.Scan() {
		line := sc.Text()
		auction := gjson.Get(line, "auction").Raw
		h := fnv.New32a()
		h.Write([]byte(auction))
		stream := streams[h.Sum32()%uint32(len(streams))]
		pipe.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []string{"k", auction, "p", line}})
		n++
		if pipe.Len() == 1000 {
			if _, err := pipe.Exec(ctx); err != nil {
				return 0, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return 0, err
	}
	return n, nil
}

func rawQ0Consume(ctx context.Context, rdb *goredis.Client, stream string, w *bufio.Writer, p *rawQ0Progress) error {
	args := &goredis.XReadGroupArgs{Group: "q0", Consumer: "c", Streams: []string{stream, ">"}, Count: 1000, Block: 10 * time.Millisecond}
	for {
		select {
		case <-p.done:
			return nil
		default:
		}
		res, err := rdb.XReadGroup(ctx, args).Result()
		if errors.Is(err, goredis.Nil) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		msgs := res[0].Messages
		ids := make([]string, len(msgs))
		p.mu.Lock()
		for i, m := range msgs {
			payload, _ := m.Values["p"].(string)
			// A bufio.Writer keeps its first error and returns it from Flush, which rawNexmarkQ0 checks.
			_, _ = w.WriteString(payload)
			_ = w.WriteByte('\n')
			ids[i] = m.ID
		}
		p.mu.Unlock()
		if err := rdb.XAck(ctx, stream, "q0", ids...).Err(); err != nil {
			return fmt.Errorf("acknowledging %s: %w", stream, err)
		}
		p.written.Add(int64(len(msgs)))
		p.check()
	}
}
