package main

import (
	"context"
	"fmt"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// publishFlowrun is the publish scenarios: the same messages as RAW-PUB, from the same number of
// goroutines, through flowrun's publish API (runtime.Publisher) on a topic of the pipeline. Like
// RAW-PUB, each goroutine writes batches of pubBatch messages with PublishBatch; with async, it
// hands them one by one to Publish, which batches them in the background.
func publishFlowrun(ctx context.Context, addr, pipeline, topic string, n, g int, async bool) (pubReport, error) {
	plan, _, diags := flow.Build(pipeline, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		return pubReport{}, fmt.Errorf("pipeline %s: %s", pipeline, diags.Error())
	}
	client, err := redis.Open(ctx, redis.Options{URLs: []string{"redis://" + addr}})
	if err != nil {
		return pubReport{}, err
	}
	defer func() { _ = client.Close() }() // the publishing is over
	pub, err := runtime.NewPublisher(client, plan)
	if err != nil {
		return pubReport{}, err
	}
	return measure(func() (int, error) {
		err := inParallel(n, g, func(first, count int) error {
			return publishChunks(ctx, pub, topic, first, count, async)
		})
		if ferr := pub.Close(ctx); err == nil {
			err = ferr // Close flushes: the window ends when everything is in Redis
		}
		return n, err
	})
}

// publishChunks publishes messages first..first+count-1 in chunks of pubBatch.
func publishChunks(ctx context.Context, pub *runtime.Publisher, topic string, first, count int, async bool) error {
	batch := make([]stages.Message, 0, pubBatch)
	chunk := make([]byte, pubBatch*payloadSize)
	for done := 0; done < count; {
		k := min(pubBatch, count-done)
		if async && done > 0 {
			// Publish keeps the payload until it is written, so each message owns its bytes: a
			// chunk per batch keeps the harness's own allocations low. PublishBatch is done with
			// them when it returns, so it reuses one chunk, as RAW-PUB does.
			chunk = make([]byte, pubBatch*payloadSize)
		}
		ts := time.Now().UnixNano()
		batch = batch[:0]
		for j := range k {
			p := chunk[j*payloadSize : (j+1)*payloadSize]
			putPayload(p, ts, phasePublish, first+done+j)
			batch = append(batch, stages.NewMessage("", p, nil))
		}
		if async {
			for _, m := range batch {
				if err := pub.Publish(ctx, topic, m); err != nil {
					return err
				}
			}
		} else if err := pub.PublishBatch(ctx, topic, batch); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// runFlowrunInProcess runs a pipeline with runtime.Run in this process, with a batch size of its
// own: an experiment (flowbench -fw-batch) for what bin/flowrun has no flag for. It has neither
// metrics nor tracing.
func runFlowrunInProcess(ctx context.Context, addr, pipeline string, batch int) error {
	plan, _, diags := flow.Build(pipeline, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		return fmt.Errorf("pipeline %s: %s", pipeline, diags.Error())
	}
	client, err := redis.Open(ctx, redis.Options{URLs: []string{"redis://" + addr}})
	if err != nil {
		return err
	}
	defer func() { _ = client.Close() }() // the run is over
	_, err = runtime.Run(ctx, plan, runtime.Options{Redis: client, BatchSize: batch})
	return err
}
