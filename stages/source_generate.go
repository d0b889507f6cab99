package stages

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The generate source's attributes.
const (
	generateSourceFieldCount    = "count"
	generateSourceFieldRate     = "rate"
	generateSourceFieldTemplate = "template"
)

// The generate source produces messages from a template, at most rate per second: for demos, load
// tests and synthetic data. A restarted generate source starts from its first message again.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "generate",
			Doc:  "Generates messages from a template: for demos, load tests and synthetic data.",
			Attributes: []flow.Attribute{
				{Name: generateSourceFieldCount, Type: flow.TypeInteger, Min: flow.Bound(0), Doc: "How many messages to generate; without it the source never ends."},
				{Name: generateSourceFieldRate, Type: flow.TypeNumber, Min: flow.Bound(0), Doc: "Messages per second; without it, as fast as the pipeline takes them."},
				{
					Name: generateSourceFieldTemplate, Type: flow.TypeMessageFields, Required: true, Roots: []string{"index"},
					Doc: "The fields of each message, as expressions where index is the message number, from 0.",
				},
			},
			Example: `source "clicks" {
  kind   = "generate"
  count  = 1000
  rate   = 200
  output = topic.clicks
  template = {
    user = "user-${index % 10}"
    page = index % 3 == 0 ? "/pricing" : "/docs"
  }
}`,
		},
		Traits: SourceTraits{
			Finite: func(config flow.Attrs) (bool, int64) {
				if !config.Has(generateSourceFieldCount) {
					return false, -1
				}
				return true, config.Int(generateSourceFieldCount)
			},
		},
		New: func(s *flow.Source, env Env) (Source, error) {
			g := &generateSource{clock: env.Clock, rate: s.Config.Float(generateSourceFieldRate), template: s.Config.Fields(generateSourceFieldTemplate), count: -1}
			if s.Config.Has(generateSourceFieldCount) {
				g.count = s.Config.Int(generateSourceFieldCount)
			}
			return g, nil
		},
	})
}

type generateSource struct {
	clock    Clock
	count    int64 // < 0: no end
	rate     float64
	template []flow.Field
}

func (g *generateSource) Produce(ctx context.Context, out Emitter) error {
	run := NewRunID()
	start := g.clock.Now()
	timer := g.clock.NewTimer(0)
	defer timer.Stop()
	for i := int64(0); g.count < 0 || i < g.count; i++ {
		if g.rate > 0 {
			due := start.Add(time.Duration(float64(i) / g.rate * float64(time.Second)))
			if wait := due.Sub(g.clock.Now()); wait > 0 {
				timer.Reset(wait)
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-timer.C():
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		at := Origin{ID: run + ":" + strconv.FormatInt(i, 10)}
		env := expr.Env{Index: i}
		value := make(map[string]any, len(g.template))
		var failed error
		for _, f := range g.template {
			v, err := f.Expr.Eval(&env)
			if err != nil {
				failed = Permanent(fmt.Errorf("template field %s of message %d: %w", f.Name, i, err))
				break
			}
			value[f.Name] = v.Interface()
		}
		var err error
		if failed != nil {
			err = out.Reject(ctx, failed, Message{Value: map[string]any{"index": i}}, at)
		} else {
			err = out.Emit(ctx, Message{Value: value}, at)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
