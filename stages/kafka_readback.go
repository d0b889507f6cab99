package stages

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaReadBackSkew is how far the clock of the process that produced a record may be behind the
// clock of the Redis server that gave its entry an ID: a read-back starts at the records stamped
// this long before the entry was made.
const kafkaReadBackSkew = time.Minute

// kafkaReadBackKeep is how long what a read-back found is kept for the next redelivered entries
// once none come: the entries a crash left come in the first batches after it.
const kafkaReadBackKeep = time.Minute

// kafkaReadBack finds which of the sink's records a topic holds, for effectively-once delivery.
//
// An entry is redelivered when the process that delivered it died, or its attempt failed, before
// Redis had its acknowledgement; its record may then be in Kafka, produced after the entry was made.
// So the read-back reads the topic's partitions from the first record stamped at the earliest
// redelivered entry's time (less kafkaReadBackSkew) to their ends as they were when it began, and
// collects the flowrun-id headers of the sink's records. It keeps where it got to: the next batch
// of redelivered entries, and an attempt that ran out of time, go on from there.
//
// What this does not cover: a process that lost its partition while alive, with a record still on
// its way to Kafka, can have it appended after the new owner read back; that record is then there
// twice, with the same flowrun-id (docs/connectors.md says so).
type kafkaReadBack struct {
	mu    sync.Mutex
	scans map[string]*kafkaScan // by topic
}

// kafkaScan is how far a topic was read back, and what it found.
type kafkaScan struct {
	since   int64           // the Unix ms it read from
	next    map[int32]int64 // by partition: the offset it read up to
	written map[string]bool // the flowrun-ids of the sink's records it found
	used    time.Time
}

// expire drops what read-backs found that no batch asked about for kafkaReadBackKeep.
func (r *kafkaReadBack) expire(now time.Time) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for topic, sc := range r.scans {
		if now.Sub(sc.used) > kafkaReadBackKeep {
			delete(r.scans, topic)
		}
	}
}

// written reads back each topic of since (the earliest entry's time by topic) and returns which of
// want (flowrun-ids by their records' topics) the topics hold.
func (r *kafkaReadBack) written(ctx context.Context, cl *kgo.Client, seeds []string, prefix string, since map[string]int64,
	want map[string]string) (map[string]bool, error) {
	// One read-back at a time: the units of a process share it, and the first one's reading serves
	// the next.
	r.mu.Lock()
	defer r.mu.Unlock()
	for topic, ms := range since {
		from := ms - kafkaReadBackSkew.Milliseconds()
		sc := r.scans[topic]
		if sc == nil || sc.since > from {
			sc = &kafkaScan{since: from, next: map[int32]int64{}, written: map[string]bool{}}
			r.scans[topic] = sc
		}
		sc.used = time.Now()
		if err := sc.read(ctx, cl, seeds, topic, []byte(prefix)); err != nil {
			return nil, err
		}
	}
	found := map[string]bool{}
	for id, topic := range want {
		if sc := r.scans[topic]; sc != nil && sc.written[id] {
			found[id] = true
		}
	}
	return found, nil
}

// read reads the topic on from where the scan got to, up to the partitions' ends as they are now:
// what is appended later is none of the redelivered entries' (but see kafkaReadBack).
func (sc *kafkaScan) read(ctx context.Context, cl *kgo.Client, seeds []string, topic string, prefix []byte) error {
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return err
	}
	for p := range ends[topic] {
		if _, ok := sc.next[p]; ok {
			continue
		}
		starts, err := adm.ListOffsetsAfterMilli(ctx, sc.since, topic)
		if err == nil {
			err = starts.Error()
		}
		if err != nil {
			return err
		}
		for p, o := range starts[topic] {
			if _, ok := sc.next[p]; !ok {
				sc.next[p] = o.Offset
			}
		}
		break
	}
	consume := map[int32]kgo.Offset{}
	for p, end := range ends[topic] {
		if sc.next[p] < end.Offset {
			consume[p] = kgo.NewOffset().At(sc.next[p])
		}
	}
	if len(consume) == 0 {
		return nil
	}
	// Control records come back too: every offset up to the end is then seen, also where the topic
	// ends with a transaction's marker.
	rc, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.KeepControlRecords(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: consume}))
	if err != nil {
		return err
	}
	defer rc.Close()
	for len(consume) > 0 {
		fetches := rc.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return ferr
		}
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			end := ends[topic][fp.Partition].Offset
			for _, rec := range fp.Records {
				if rec.Offset >= end {
					break
				}
				if id := kafkaHeader(rec, kafkaIDHeader); bytes.HasPrefix(id, prefix) {
					sc.written[string(id)] = true
				}
				sc.next[fp.Partition] = rec.Offset + 1
			}
			if sc.next[fp.Partition] >= end {
				delete(consume, fp.Partition)
			}
		})
	}
	return nil
}

// kafkaHeader returns the value of a record's header; nil when it has none of that key.
func kafkaHeader(rec *kgo.Record, key string) []byte {
	for _, h := range rec.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}
