package cmd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
)

// produceFlushEvery is how many messages produce publishes between two flushes, so that a write
// error (Redis gone, out of memory) stops it early instead of after all of standard input.
const produceFlushEvery = 10000

// produceDrainTime bounds writing what was already published when produce is interrupted.
const produceDrainTime = 10 * time.Second

func newProduceCommand(stdio IO) *cobra.Command {
	var flags pipelineFlags
	var conn redisFlags
	var keyExpr string
	c := &cobra.Command{
		Use:   "produce PATH TOPIC",
		Short: "Publish JSON lines from standard input to a topic",
		Long: "Produce compiles a pipeline and publishes each line of standard input, which must be a JSON object, " +
			"as a message to one of its topics, in the partition that the message's key picks.\n\n" +
			"The key is computed by the topic's own key expression when it has one; otherwise by --key, an " +
			"expression over msg such as msg.customer_id; otherwise the message has no key and the messages " +
			"go to the partitions in turn. The topic's key expression wins over --key.\n\n" +
			"A line that is not a JSON object, does not satisfy the topic's schema, or whose key cannot be computed, is reported as stdin:LINE on " +
			"standard error and skipped; the other lines are published. Blank lines are ignored.\n\n" +
			"Produce needs a real Redis (--redis or " + EnvRedisURL + "): an embedded one would lose the " +
			"messages when produce exits.\n\n" +
			"  echo '{\"type\":\"order.placed\",\"order_id\":\"1001\",\"amount\":42.5}' | flowrun produce examples/pipelines/orders orders\n" +
			"  flowrun produce --key msg.user pipeline.hcl clicks < clicks.jsonl\n\n" +
			"Exit status: 0 when every line was published, 1 when a line was bad or Redis failed, 2 when the " +
			"pipeline, the topic or --key is invalid.",
		Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			plan, err := buildPlan(stdio, &flags, args[0])
			if err != nil {
				return err
			}
			topic, err := topicArg(plan, args[1])
			if err != nil {
				return err
			}
			if why := fusedLink(plan, topic); why != "" {
				return exitError{code: ExitInvalid, message: "nothing would read what you publish: " + why + "."}
			}
			var key *flow.KeyExpr
			if keyExpr != "" {
				if key, err = compileKeyFlag(stdio, keyExpr); err != nil {
					return err
				}
				if topic.Key != nil {
					note(stdio.Err, "flowrun: topic %s computes keys with its own expression (%s); --key is not used\n",
						topic.Name, topic.Key)
					key = nil
				}
			}
			client, closeRedis, err := conn.connect(c.Context(), stdio.Err, false)
			if err != nil {
				return err
			}
			defer closeRedis()
			pub, err := runtime.NewPublisherWith(client.Client(), plan, runtime.PublisherOptions{
				HeldBack: func(topic string, partition int, maxLag int64) {
					note(stdio.Err, "flowrun: partition %d of topic %s holds max_lag (%d) messages that its readers have "+
						"not processed: waiting for them to catch up\n", partition, topic, maxLag)
				},
			})
			if err != nil {
				return exitError{code: ExitError, message: err.Error()}
			}
			return produce(c.Context(), stdio, pub, topic.Name, key)
		},
	}
	flags.register(c)
	conn.register(c)
	c.Flags().StringVar(&keyExpr, "key", "", "an expression over msg that computes each message's key, e.g. msg.customer_id "+
		"(not used when the topic has its own key expression)")
	return c
}

// stdinLine is a line of standard input, numbered from 1, or the error that ended reading.
type stdinLine struct {
	n    int
	text []byte
	err  error
}

// readLines sends the lines of r, each with its line end, until EOF, a read error or done.
// Reading runs in its own goroutine so that an interrupt is noticed while standard input waits;
// a goroutine blocked in Read at that moment stays blocked until the process exits, which Main
// does right after.
func readLines(r io.Reader, done <-chan struct{}) <-chan stdinLine {
	lines := make(chan stdinLine, 256)
	send := func(l stdinLine) bool {
		select {
		case lines <- l:
			return true
		case <-done:
			return false
		}
	}
	go func() {
		defer close(lines)
		br := bufio.NewReaderSize(r, 64<<10)
		for n := 1; ; n++ {
			text, err := br.ReadBytes('\n') // a new slice per line: the publisher keeps it until written
			if len(text) > 0 && !send(stdinLine{n: n, text: text}) {
				return
			}
			if err != nil {
				if err != io.EOF {
					send(stdinLine{n: n, err: err})
				}
				return
			}
		}
	}()
	return lines
}

// produce publishes the JSON lines of standard input to topic and reports on standard error.
func produce(ctx context.Context, stdio IO, pub *runtime.Publisher, topic string, key *flow.KeyExpr) error {
	done := make(chan struct{})
	defer close(done)
	lines := readLines(stdio.In, done)
	published, bad := 0, 0
	interrupted := false
	fail := func(format string, args ...any) error {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), produceDrainTime)
		defer cancel()
		_ = pub.Close(closeCtx)
		return exitError{code: ExitError, message: fmt.Sprintf(format, args...)}
	}
read:
	for {
		var l stdinLine
		var ok bool
		select {
		case l, ok = <-lines:
		case <-ctx.Done():
			interrupted = true
			break read
		}
		if !ok {
			break read
		}
		if l.err != nil {
			return fail("reading standard input (line %d): %v", l.n, l.err)
		}
		text := bytes.TrimSpace(l.text)
		if len(text) == 0 {
			continue
		}
		value, err := stages.DecodePayload(text)
		if err != nil {
			bad++
			note(stdio.Err, "stdin:%d: %v\n", l.n, err)
			continue
		}
		m := stages.NewMessage("", text, nil)
		m.Value = value // already decoded: the topic's key expression needs no second pass
		if key != nil {
			k, err := key.Key(value)
			if err != nil {
				bad++
				note(stdio.Err, "stdin:%d: --key: %s\n", l.n, flow.EvalMessage(err))
				continue
			}
			m.Key = k
		}
		if err := pub.Publish(ctx, topic, m); err != nil {
			if stages.IsPermanent(err) {
				bad++
				note(stdio.Err, "stdin:%d: %v\n", l.n, err)
				continue
			}
			if ctx.Err() != nil {
				interrupted = true
				break read
			}
			return fail("publishing line %d to topic %s: %v", l.n, topic, err)
		}
		published++
		if published%produceFlushEvery == 0 {
			if err := pub.Flush(ctx); err != nil {
				if ctx.Err() != nil {
					interrupted = true
					break read
				}
				return fail("publishing to topic %s: %v", topic, err)
			}
		}
	}
	// Write what was published, even after an interrupt.
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), produceDrainTime)
	defer cancel()
	if err := pub.Close(closeCtx); err != nil {
		return exitError{code: ExitError, message: fmt.Sprintf("publishing to topic %s: %v", topic, err)}
	}
	note(stdio.Err, "published %d message%s to topic %s\n", published, plural(published), topic)
	switch {
	case interrupted:
		return exitError{code: ExitError, message: "interrupted before the end of standard input"}
	case bad > 0:
		return exitError{code: ExitError, message: fmt.Sprintf("%d line%s not published (see above)", bad, plural(bad))}
	}
	return nil
}

// compileKeyFlag compiles --key, an expression over msg.
func compileKeyFlag(stdio IO, src string) (*flow.KeyExpr, error) {
	const name = "--key"
	key, file, diags := flow.CompileKeyExpr(name, src)
	if !diags.HasErrors() {
		return key, nil
	}
	printDiagnostics(stdio.Err, diags, map[string]*hcl.File{name: file})
	return nil, exitError{code: ExitInvalid, message: "invalid --key expression"}
}
