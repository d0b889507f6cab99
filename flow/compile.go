package flow

import (
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/zclconf/go-cty/cty"
)

// Options are the inputs of a compilation besides the pipeline's files.
type Options struct {
	// Vars are --var NAME=VALUE assignments, in order; a later one wins.
	Vars []string
	// VarFiles are --var-file paths, in order; a later one wins.
	VarFiles []string
	// Values are variable values given as values (a test file's variables block); they win over
	// Vars, VarFiles and the environment, and convert to each variable's type as those do.
	Values map[string]cty.Value
	// ValueRanges are where each of Values is written, to locate their diagnostics; optional.
	ValueRanges map[string]hcl.Range
	// LookupEnv reads environment variables for env() and FLOWRUN_VAR_NAME; nil means os.LookupEnv.
	LookupEnv func(name string) (string, bool)
	// GoFuncs are the names of the Go stage functions registered in this binary (stages.Names()).
	GoFuncs []string
}

// compiler holds the state of one compilation.
type compiler struct {
	cfg   *Config
	opts  Options
	ctx   *hcl.EvalContext
	plan  *Plan
	diags hcl.Diagnostics

	topics    map[string]*Topic      // declared topics
	tables    map[string]*Table      // tables, by name
	tableUsed map[string]bool        // tables that a lookup reads
	implicit  map[string]*Topic      // implicit stage outputs, by stage name
	retries   map[string]RetryPolicy // retry policies, by name
	topicUsed map[string]bool        // topics that something refers to
	retryUsed map[string]bool        // retry policies that something refers to
	resolving map[string]bool        // stages whose implicit output is being sized, against cycles
	// unresolved is set when a reference failed: the graph is then incomplete, and checks of its
	// shape would report consequences of that error rather than mistakes of their own.
	unresolved bool
	// schemas are the topics' compiled schemas, by location and text (msgschema.go).
	schemas map[string]*jsonschema.Schema
}

// Compile evaluates a loaded pipeline into a Plan and checks it as a whole: references, types,
// durations, the graph's shape. It returns every diagnostic at once; the Plan is nil when any of
// them is an error.
func Compile(cfg *Config, opts Options) (*Plan, hcl.Diagnostics) {
	c := &compiler{
		cfg:        cfg,
		opts:       opts,
		plan:       &Plan{},
		topics:     map[string]*Topic{},
		tables:     map[string]*Table{},
		tableUsed:  map[string]bool{},
		implicit:   map[string]*Topic{},
		retries:    map[string]RetryPolicy{},
		topicUsed:  map[string]bool{},
		retryUsed:  map[string]bool{},
		resolving:  map[string]bool{},
		unresolved: cfg.incomplete,
	}
	c.ctx = c.newEvalContext()
	c.ctx.Variables["var"] = c.compileVariables()
	c.plan.secrets = c.plan.sensitiveStrings()
	c.ctx.Variables["local"] = c.compileLocals()
	c.compilePipeline()
	c.compileTopics()
	c.compileTables()
	c.compileRetries()

	for _, b := range cfg.Sources {
		c.plan.Sources = append(c.plan.Sources, c.compileSource(b))
	}
	blocks := map[*Stage]*Block{}
	for _, b := range cfg.Stages {
		s := c.compileStage(b)
		blocks[s] = b
		c.plan.Stages = append(c.plan.Stages, s)
	}
	for _, b := range cfg.Sinks {
		c.plan.Sinks = append(c.plan.Sinks, c.compileSink(b))
	}
	c.finishStageOutputs(blocks)
	c.addTableStages()
	c.insertRepartitions()
	c.collectTopics()
	c.checkGraph(blocks)
	if !c.unresolved {
		c.checkMessageShapes(blocks)
	}
	if !c.unresolved && !c.diags.HasErrors() {
		c.wireWatermarks(blocks)
	}

	if c.diags.HasErrors() {
		return nil, c.diags
	}
	c.plan.fuseStages(nil)
	c.computeDefinitions(blocks)
	return c.plan, c.diags
}

// Build loads and compiles the pipeline at path. It returns the Config too, even on errors, for
// printing diagnostics with source snippets.
func Build(path string, opts Options) (*Plan, *Config, hcl.Diagnostics) {
	cfg, diags := Load(path)
	if cfg.syntaxErrors {
		// A file that does not parse is only partly known: compiling it would mostly report
		// consequences of the syntax error. Other errors of the files still show all at once.
		return nil, cfg, SortDiagnostics(diags)
	}
	plan, moreDiags := Compile(cfg, opts)
	return plan, cfg, SortDiagnostics(append(diags, moreDiags...))
}

// collectTopics puts the declared and implicit topics in the plan, sorted by name.
func (c *compiler) collectTopics() {
	for _, t := range c.topics {
		c.plan.Topics = append(c.plan.Topics, t)
	}
	for _, t := range c.implicit {
		c.plan.Topics = append(c.plan.Topics, t)
	}
	sort.Slice(c.plan.Topics, func(i, j int) bool { return c.plan.Topics[i].Name < c.plan.Topics[j].Name })
}

// checkKind runs the checks of a block's kind, if it has any.
func (c *compiler) checkKind(b *Block, config *Attrs, ordering Ordering) {
	if b.Kind == nil || b.Kind.Check == nil {
		return
	}
	b.Kind.Check(&KindCheck{Pipeline: c.plan.Name, Name: b.Name, Config: config, Ordering: ordering, GoFuncs: c.opts.GoFuncs, block: b, c: c})
}
