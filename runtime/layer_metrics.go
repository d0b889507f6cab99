package runtime

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// withMetrics measures how long each message took, all attempts included, and how old its entry
// was when the node took it. The measurements wait in the lane's buffer (pass.measured) until the
// lane is done (record), and then go, every one of them, to the process's Histograms (one lock
// per lane and batch: what flowrun run does) or through the MeterProvider's histograms, a Record
// each on options built once per node, which allocates nothing. Either way the histograms are
// those of recording each message at once. Without metrics (the instruments are made when the run
// starts) it adds nothing, not even a clock reading.
func (r *processing) withMetrics(n *node, next messageFunc) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		if p.measured == nil {
			return next(ctx, m, buf, p)
		}
		started := r.clock.Now()
		res, buf, err := next(ctx, m, buf, p)
		o := measurement{node: n, took: r.clock.Now().Sub(started).Seconds()}
		if written, ok := entryTime(m.id); ok {
			o.age, o.aged = started.Sub(written).Seconds(), true
		}
		p.measured.add(o)
		return res, buf, err
	}
}

// measurement is what withMetrics measured of one message at one node.
type measurement struct {
	node *node
	took float64 // seconds, all attempts
	age  float64 // seconds from the entry's write to the start of processing, when aged
	aged bool    // the message's ID tells when its entry was written
}

// measurements are a lane's, until the lane has processed its messages. A lane's messages are
// processed one after another, so nothing else touches them meanwhile.
type measurements struct {
	list []measurement
}

func (o *measurements) add(m measurement) { o.list = append(o.list, m) }

// measurementPool recycles the lanes' measurements: a batch's lanes take them and give them back.
var measurementPool = sync.Pool{New: func() any { return &measurements{} }}

// measuring returns the measurements a lane of a batch collects, nil without metrics.
func (r *processing) measuring() *measurements {
	if !r.metrics.on() {
		return nil
	}
	return measurementPool.Get().(*measurements)
}

// record records a lane's measurements, each as a record of its own, and gives them back.
func (r *processing) record(o *measurements) {
	if o == nil {
		return
	}
	if r.metrics.local != nil {
		r.metrics.local.add(o.list)
	} else {
		r.recordEach(o.list)
	}
	clear(o.list) // the nodes are not kept alive by a pooled slice
	o.list = o.list[:0]
	measurementPool.Put(o)
}

// recordEach records measurements through the MeterProvider's histograms, one Record each.
func (r *processing) recordEach(list []measurement) {
	ctx := context.Background()
	for i := range list {
		ms := &list[i]
		r.metrics.duration.Record(ctx, ms.took, ms.node.recordAttrs...)
		if ms.aged {
			r.metrics.age.Record(ctx, ms.age, ms.node.recordAttrs...)
		}
	}
}

// setMetricAttrs gives a node its attributes on its metrics: as an option of the observed
// instruments, and as the options of a record, made once so that recording allocates nothing.
func setMetricAttrs(n *node) {
	n.metricAttrs = metricAttrsOf(n)
	n.recordAttrs = []metric.RecordOption{n.metricAttrs}
}

// entryTime reads the time a stream entry was written from its ID ("<ms>-<seq>").
func entryTime(id string) (time.Time, bool) {
	n, err := redis.IDMillis(id)
	if err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}
