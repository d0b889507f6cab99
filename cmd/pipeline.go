package cmd

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// pipelineFlags are the flags of every command that compiles a pipeline.
type pipelineFlags struct {
	vars     []string
	varFiles []string
}

func (f *pipelineFlags) register(c *cobra.Command) {
	c.Flags().StringArrayVar(&f.vars, "var", nil, "set a pipeline variable, as NAME=VALUE (repeatable)")
	c.Flags().StringArrayVar(&f.varFiles, "var-file", nil, "read pipeline variables from an .hcl or .hcl.json file of NAME = VALUE (repeatable)")
}

// build loads and compiles the pipeline at path with the flags' variables and this binary's Go
// stage functions.
func (f *pipelineFlags) build(path string) (*flow.Plan, *flow.Config, hcl.Diagnostics) {
	return flow.Build(path, f.options())
}

// options are the compile options of the flags' variables and this binary's Go stage functions.
func (f *pipelineFlags) options() flow.Options {
	return flow.Options{Vars: f.vars, VarFiles: f.varFiles, GoFuncs: stages.Names()}
}

// buildPlan compiles the pipeline at path for a command that runs against Redis. It prints the
// diagnostics only when there are errors: warnings are validate's business.
func buildPlan(stdio IO, flags *pipelineFlags, path string) (*flow.Plan, error) {
	plan, cfg, diags := flags.build(path)
	if diags.HasErrors() {
		printDiagnostics(stdio.Err, diags, cfg.Files())
		return nil, exitError{code: ExitInvalid}
	}
	return plan, nil
}

// topicArg returns the plan's topic with the given name, or an exit-2 error that lists the topics
// and suggests the closest one.
func topicArg(plan *flow.Plan, name string) (*flow.Topic, error) {
	if t := plan.Topic(name); t != nil {
		return t, nil
	}
	names := make([]string, len(plan.Topics))
	for i, t := range plan.Topics {
		names[i] = t.Name
	}
	sort.Strings(names)
	msg := fmt.Sprintf("pipeline %s has no topic %q.", plan.Name, name)
	if s := flow.Suggest(name, names); s != "" {
		msg += fmt.Sprintf(" Did you mean %q?", s)
	}
	if len(names) == 0 {
		msg += " It has no topics."
	} else {
		msg += " The topics are " + quoteList(names) + "."
	}
	return nil, exitError{code: ExitInvalid, message: msg}
}

// readTopicArg returns the topic that arg names for a command that reads one: a topic's name, or
// stage.NAME for what the stage writes, whatever that topic is called (a stage that declares no
// output and is read as stage.NAME writes to a topic the compiler names). Otherwise it returns an
// exit-2 error that lists the topics and the stages.
func readTopicArg(plan *flow.Plan, arg string) (*flow.Topic, error) {
	stages := stageAddresses(plan)
	name, isStage := strings.CutPrefix(arg, "stage.")
	if !isStage {
		t, err := topicArg(plan, arg)
		if e, ok := err.(exitError); ok && len(stages) > 0 {
			e.message += " Or name a stage's output as stage.NAME: the stages are " + strings.Join(stages, ", ") + "."
			return nil, e
		}
		return t, err
	}
	s := plan.Stage(name)
	if s == nil || s.Kind == flow.RepartitionKind {
		msg := fmt.Sprintf("pipeline %s has no stage %q.", plan.Name, name)
		if len(stages) == 0 {
			msg += " It has no stages."
		} else {
			msg += flow.DidYouMean(arg, stages) + " The stages are " + strings.Join(stages, ", ") + "."
		}
		return nil, exitError{code: ExitInvalid, message: msg}
	}
	if s.Output != nil {
		return s.Output, nil
	}
	outputs := s.Outputs()
	if len(outputs) == 0 {
		return nil, exitError{code: ExitInvalid, message: fmt.Sprintf("stage %s writes to no topic.", name)}
	}
	names := make([]string, len(outputs))
	for i, t := range outputs {
		names[i] = t.Name
	}
	return nil, exitError{code: ExitInvalid, message: fmt.Sprintf("the %s stage %s writes to several topics, %s: "+
		"name one of them.", s.Kind, name, quoteList(names))}
}

// stageAddresses lists the stages the pipeline declares, as stage.NAME, sorted.
func stageAddresses(plan *flow.Plan) []string {
	var names []string
	for _, s := range plan.Stages {
		if s.Kind != flow.RepartitionKind {
			names = append(names, "stage."+s.Name)
		}
	}
	sort.Strings(names)
	return names
}

// fusedLink explains that topic t is a link inside a fused chain, which no stream holds; "" when it
// is not one.
func fusedLink(plan *flow.Plan, t *flow.Topic) string {
	c, s := plan.LinkOf(t)
	if c == nil {
		return ""
	}
	return fmt.Sprintf("topic %s is a link inside the fused chain %s, whose stages pass their messages in memory: "+
		"no stream holds it while the chain runs. Use the chain's input, topic %s, or set fuse = false on stage %s "+
		"to make it a stream", t.Name, c.Name(), c.Head().Input.Name, s.Name)
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
