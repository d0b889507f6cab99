package runtime

import (
	"context"
	"errors"
	"strconv"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A fused chain's messages at run time: each passes the chain's stages in turn, each stage with
// its own layers, in one hop. How chains are wired into the nodes at start is fusion.go.

// fused is the messageFunc of a chain's first node: the message through the chain.
func (r *processing) fused(c *chain) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		from := 0
		if m.retry != nil && m.retry.Stage != "" {
			from = c.index(m.retry.Stage) // in the chain: processMessage hands on the others
		}
		var local [4]counts // what the message did at each stage; longer chains allocate
		per := local[:]
		if len(c.nodes) > len(local) {
			per = make([]counts, len(c.nodes))
		}
		per = per[:len(c.nodes)]
		res, buf := r.runChain(ctx, c, from, m, m.fresh(), buf, p, per)
		if !res.abandoned && p.counts != nil {
			p.counts.addChain(per) // counted once the batch commits (outcomes.go)
		}
		return res, buf, nil
	}
}

// runChain runs m through the chain's stages from the i-th one (fresh: m is new to that stage, see
// message.fresh). The outputs of the last stage are appended to buf, and the result's outs is the
// appended part; per counts what became of the messages at each stage.
func (r *processing) runChain(ctx context.Context, c *chain, i int, m *message, fresh bool, buf []redis.Output, p pass, per []counts) (result, []redis.Output) {
	start := len(buf)
	res, buf, _ := c.steps[i](ctx, m, buf, p)
	if res.abandoned {
		return res, buf
	}
	per[i].settle(m, &res, fresh)
	if i == len(c.nodes)-1 || len(res.retries) > 0 || len(res.outs) == 0 {
		return res, buf // the last stage's outputs, a retry, a dead letter, or nothing to pass on
	}
	// The stage's outputs are the next stage's messages: take them out of buf, which the next
	// stage's outputs fill in their place.
	made := res.outs
	if len(made) == 1 {
		made = []redis.Output{made[0]} // does not escape: the common case allocates nothing more
	} else {
		made = append([]redis.Output(nil), made...)
	}
	buf = buf[:start]
	// A stage may dead-letter a message for some of its outputs and pass on others (an aggregate's
	// message late for some of its windows): its dead letters stay the message's.
	all := result{deadLetters: res.deadLetters}
	for j := range made {
		e := made[j].Entry
		if len(e.Payload) == 0 && e.Large != nil {
			// A large message the stage changed, whose payload a commit would make as it writes
			// it: the next stage reads it whole, as it would from the stream (the measure that
			// made Large encoded it already, so encoding it cannot fail now).
			payload, err := e.Large.Bytes()
			if err != nil { // never: but not an empty message to the next stage either
				all.deadLetters = append(all.deadLetters, r.deadLetterMessage(c.nodes[i], m, err, 1, r.clock.Now()))
				continue
			}
			e.Payload, e.Large = payload, nil
		}
		mj := message{id: m.id, path: m.path, partition: m.partition, trace: traceOf(e)}
		if len(made) > 1 {
			mj.path = m.path + "." + strconv.Itoa(j)
			mj.msg = stages.NewMessage(e.Key, e.Payload, e.Headers)
		} else {
			// A message that stage passed on unchanged (a filter's) keeps the fields it decoded.
			mj.msg = stages.PassedOn(e.Key, e.Payload, e.Headers, &m.msg)
		}
		rj, b := r.runChain(ctx, c, i+1, &mj, true, buf, p, per)
		buf = b
		if rj.abandoned {
			// The whole entry comes again after the restart: drop what its other messages made.
			return result{abandoned: true}, buf[:start]
		}
		all.deadLetters = append(all.deadLetters, rj.deadLetters...)
		all.retries = append(all.retries, rj.retries...)
	}
	all.outs = buf[start:len(buf):len(buf)]
	return all, buf
}

// handOn passes on a due retry for a stage that does not run in head's chain (the pipeline changed,
// or the link runs unfused this time): to the stage's input topic, which it then reads, as the stage
// before it would have written it. A stage that is gone, or fused after another one now, cannot
// take it that way: the message is dead-lettered, to be replayed from there (flowrun dlq replay).
func (r *processing) handOn(head *node, m *message, buf []redis.Output, _ pass) (result, []redis.Output, error) {
	m.outcome = outcomeHandedOn // new to head, which counts it (worker.prepare)
	to := r.stage(m.retry.Stage)
	if to == nil || to.input == nil || to.resumeAs != "" {
		err := errors.New("a retry waited here for stage " + m.retry.Stage + ", which this process does not run as a stage with a stream of its own " +
			"(the pipeline changed); replay the message to send it where the stage runs now")
		return result{deadLetters: []redis.Output{r.deadLetterMessage(head, m, err, m.attempts, m.firstFailure)}}, buf, err
	}
	out, err := r.topicOutput(head, m, to.input, &m.msg, 0, m.partition)
	if err != nil {
		return result{deadLetters: []redis.Output{r.deadLetterMessage(head, m, err, m.attempts, m.firstFailure)}}, buf, err
	}
	out.Entry.TraceParent, out.Entry.TraceState = m.trace.parent, m.trace.state
	buf = append(buf, out)
	return result{outs: buf[len(buf)-1 : len(buf) : len(buf)]}, buf, nil
}
