package flow_test

import (
	. "github.com/flowrun/flowrun/flow"
	_ "github.com/flowrun/flowrun/stages"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/flowrun/flowrun/flow/expr"
)

// compileSource compiles an in-memory single-file pipeline and fails the test on errors.
func compileSource(t *testing.T, src string, opts Options) *Plan {
	t.Helper()
	plan, diags := compileDiags(t, src, opts)
	if diags.HasErrors() {
		t.Fatalf("compile: %s", diags)
	}
	return plan
}

func compileDiags(t *testing.T, src string, opts Options) (*Plan, hcl.Diagnostics) {
	t.Helper()
	if opts.LookupEnv == nil {
		opts.LookupEnv = func(string) (string, bool) { return "", false }
	}
	cfg, diags := LoadSource(map[string][]byte{"p.hcl": []byte(src)})
	plan, more := Compile(cfg, opts)
	return plan, append(diags, more...)
}

const varsPipeline = `
pipeline "v" {}
variable "n" {
  type    = number
  default = 1
}
variable "name" {
  type    = string
  default = "default"
}
variable "tags" {
  type    = list(string)
  default = []
}
topic "t" { partitions = var.n }
source "s" {
  kind   = "stdin"
  output = topic.t
}
sink "o" {
  kind  = "file"
  input = topic.t
  path  = "${var.name}-${length(var.tags)}.jsonl"
}
`

func TestVariablePrecedence(t *testing.T) {
	dir := t.TempDir()
	varFile := filepath.Join(dir, "prod.hcl")
	if err := os.WriteFile(varFile, []byte("n = 3\nname = \"file\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"FLOWRUN_VAR_n": "2", "FLOWRUN_VAR_name": "env", "FLOWRUN_VAR_tags": `["a", "b"]`}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	cases := []struct {
		name      string
		opts      Options
		wantParts int
		wantPath  string
	}{
		{"defaults", Options{}, 1, "default-0.jsonl"},
		{"environment over defaults", Options{LookupEnv: lookup}, 2, "env-2.jsonl"},
		{"var file over environment", Options{LookupEnv: lookup, VarFiles: []string{varFile}}, 3, "file-2.jsonl"},
		{"--var over var file", Options{LookupEnv: lookup, VarFiles: []string{varFile}, Vars: []string{"n=4", "name=flag"}}, 4, "flag-2.jsonl"},
		{"later --var wins", Options{Vars: []string{"n=4", "n=5"}}, 5, "default-0.jsonl"},
		{"string taken as it is", Options{Vars: []string{"name=a=b c"}}, 1, "a=b c-0.jsonl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := compileSource(t, varsPipeline, tc.opts)
			if got := p.Topic("t").Partitions; got != tc.wantParts {
				t.Errorf("partitions = %d, want %d", got, tc.wantParts)
			}
			if got := p.Sinks[0].Config.String("path"); got != tc.wantPath {
				t.Errorf("path = %q, want %q", got, tc.wantPath)
			}
		})
	}
}

func TestVariableErrors(t *testing.T) {
	cases := map[string]struct {
		opts Options
		want string
	}{
		"undeclared --var":   {Options{Vars: []string{"nn=2"}}, `declares no such variable. Did you mean "n"?`},
		"malformed --var":    {Options{Vars: []string{"n"}}, "must have the form NAME=VALUE"},
		"wrong type":         {Options{Vars: []string{"n=many"}}, "is not a valid number"},
		"missing var file":   {Options{VarFiles: []string{"/nonexistent/x.hcl"}}, "no such file or directory"},
		"partitions from -v": {Options{Vars: []string{"n=0"}}, "partitions must be at least 1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, diags := compileDiags(t, varsPipeline, tc.opts)
			if !diags.HasErrors() || !strings.Contains(diags.Error(), tc.want) {
				t.Fatalf("diagnostics %q do not mention %q", diags.Error(), tc.want)
			}
		})
	}
}

func TestSensitiveValuesAreRedacted(t *testing.T) {
	p := compileSource(t, `
pipeline "s" {}
variable "token" {
  default   = "s3cr3t-token"
  sensitive = true
}
topic "t" {}
source "s" {
  kind   = "stdin"
  output = topic.t
}
sink "h" {
  kind    = "http"
  input   = topic.t
  url     = "https://example.com/hook?token=${var.token}"
  headers = { Authorization = "Bearer ${var.token}" }
}
`, Options{})
	if !p.Variables[0].Sensitive {
		t.Fatal("the variable is not marked sensitive")
	}
	var sb strings.Builder
	if err := WriteGraph(&sb, p, "json"); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	if strings.Contains(out, "s3cr3t") {
		t.Fatalf("the graph shows the secret:\n%s", out)
	}
	if !strings.Contains(out, "Bearer (sensitive)") {
		t.Fatalf("the graph does not show the redacted header:\n%s", out)
	}
	// The plan itself keeps the real value: the runtime needs it.
	if got := p.Sinks[0].Config.StringMap("headers")["Authorization"]; got != "Bearer s3cr3t-token" {
		t.Fatalf("header = %q", got)
	}
}

func TestPlanShape(t *testing.T) {
	p := compileSource(t, `
pipeline "shop" {
  delivery = "effectively_once"
}
retry "patient" {
  max_attempts = 7
  backoff      = "linear"
  initial      = "1s"
}
topic "orders" {
  partitions = 6
  key        = msg.customer
}
topic "eu" { partitions = 2 }
topic "failed" {}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
# Declared before the stage it reads, to show that order does not matter.
sink "console" {
  kind  = "stdout"
  input = stage.enrich
}
stage "split" {
  kind  = "route"
  input = stage.enrich
  case {
    when   = msg.region == "eu"
    output = topic.eu
  }
  default = topic.failed
}
stage "enrich" {
  kind        = "map"
  input       = topic.orders
  retry       = retry.patient
  dead_letter = topic.failed
  delivery    = "at_least_once"
  set         = { seen = true }
}
sink "eu" {
  kind  = "stdout"
  input = topic.eu
}
sink "dead" {
  kind  = "stdout"
  input = topic.failed
}
`, Options{})

	if p.KeyPrefix != "flowrun:shop" {
		t.Errorf("key prefix = %q, want the default flowrun:shop", p.KeyPrefix)
	}
	enrich := p.Stage("enrich")
	if enrich.Output == nil || !enrich.Output.Implicit || enrich.Output.Name != "enrich.out" {
		t.Fatalf("enrich output = %+v, want the implicit topic enrich.out", enrich.Output)
	}
	if enrich.Output.Partitions != 6 {
		t.Errorf("the implicit topic has %d partitions, want its input's 6", enrich.Output.Partitions)
	}
	if enrich.Retry.Name != "patient" || enrich.Retry.MaxAttempts != 7 || enrich.Retry.Backoff != BackoffLinear ||
		enrich.Retry.Initial != time.Second || enrich.Retry.Max != DefaultRetry.Max || enrich.Retry.Jitter != DefaultRetry.Jitter {
		t.Errorf("retry = %+v", enrich.Retry)
	}
	if enrich.DeadLetter != p.Topic("failed") || enrich.Delivery != AtLeastOnce {
		t.Errorf("dead letter %v, delivery %v", enrich.DeadLetter, enrich.Delivery)
	}
	if enrich.Ordering != OrderByKey || enrich.Concurrency != 4 || enrich.Timeout != 30*time.Second {
		t.Errorf("defaults: ordering %v, concurrency %d, timeout %v", enrich.Ordering, enrich.Concurrency, enrich.Timeout)
	}
	split := p.Stage("split")
	if split.Delivery != EffectivelyOnce || split.Retry != DefaultRetry || split.Output != nil {
		t.Errorf("split: delivery %v, retry %+v, output %v", split.Delivery, split.Retry, split.Output)
	}
	if split.Input != enrich.Output {
		t.Errorf("split reads %v, want enrich's output", split.Input)
	}
	outs := split.Outputs()
	if len(outs) != 2 || outs[0].Name != "eu" || outs[1].Name != "failed" {
		t.Errorf("route outputs = %v, want its case then its default", topicNames(outs))
	}
	if cases := split.Config.Blocks("case"); len(cases) != 1 || cases[0].Expr("when") == nil {
		t.Errorf("route cases = %+v", cases)
	}
	// Stages come in dependency order, whatever the declaration order.
	if p.Stages[0].Name != "enrich" || p.Stages[1].Name != "split" {
		t.Errorf("stage order = %s, %s", p.Stages[0].Name, p.Stages[1].Name)
	}
	edges := map[string]EdgeKind{}
	for _, e := range p.Edges {
		edges[e.From+" -> "+e.To] = e.Kind
	}
	for edge, kind := range map[string]EdgeKind{
		"source.in -> topic.orders":        EdgeWrites,
		"topic.orders -> stage.enrich":     EdgeReads,
		"stage.enrich -> topic.enrich.out": EdgeWrites,
		"stage.enrich -> topic.failed":     EdgeDeadLetter,
		"topic.enrich.out -> sink.console": EdgeReads,
		"stage.split -> topic.eu":          EdgeWrites,
	} {
		if edges[edge] != kind {
			t.Errorf("edge %s is %q, want %q", edge, edges[edge], kind)
		}
	}
}

func topicNames(ts []*Topic) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}

func TestMessageExpressionsCompile(t *testing.T) {
	p := compileSource(t, `
pipeline "e" {}
variable "vat" { default = 0.25 }
locals { threshold = 100 }
topic "t" { key = msg.customer }
source "s" {
  kind   = "generate"
  count  = 3
  output = topic.t
  template = {
    customer = "c-${index % 2}"
    amount   = index * 100
  }
}
stage "m" {
  kind  = "map"
  input = topic.t
  set = {
    gross = msg.amount * (1 + var.vat)
    big   = msg.amount > local.threshold
  }
}
sink "o" {
  kind  = "stdout"
  input = stage.m
  where = msg.big
}
`, Options{})
	tmpl := p.Sources[0].Config.Fields("template")
	if len(tmpl) != 2 || tmpl[0].Name != "customer" || tmpl[1].Name != "amount" {
		t.Fatalf("template fields = %+v, want customer then amount", tmpl)
	}
	v, err := tmpl[0].Expr.EvalString(&expr.Env{Index: 3})
	if err != nil || v != "c-1" {
		t.Errorf("template customer = %q, %v", v, err)
	}
	msg := map[string]any{"customer": "c-1", "amount": 200.0}
	set := p.Stage("m").Config.Fields("set")
	gross, err := set[0].Expr.Eval(&expr.Env{Msg: msg})
	if err != nil || gross.Interface() != 250.0 {
		t.Errorf("gross = %v, %v; want 250", gross.Interface(), err)
	}
	big, err := set[1].Expr.EvalBool(&expr.Env{Msg: msg})
	if err != nil || !big {
		t.Errorf("big = %v, %v", big, err)
	}
	key, err := p.Topic("t").Key.EvalString(&expr.Env{Msg: msg})
	if err != nil || key != "c-1" {
		t.Errorf("key = %q, %v", key, err)
	}
	if p.Sinks[0].Where == nil {
		t.Error("the sink's where is not compiled")
	}
}

func TestJSONSyntaxPipeline(t *testing.T) {
	plan, _, diags := Build(filepath.Join(examplesDir, "greetings.hcl.json"), Options{Vars: []string{"count=4"}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	src := plan.Sources[0]
	if src.Config.Int("count") != 4 {
		t.Errorf("count = %d, want 4 from --var", src.Config.Int("count"))
	}
	name, err := src.Config.Fields("template")[0].Expr.EvalString(&expr.Env{Index: 5})
	if err != nil || name != "grace" {
		t.Errorf("template name for index 5 = %q, %v", name, err)
	}
	text, err := plan.Stage("greet").Config.Fields("set")[0].Expr.EvalString(&expr.Env{Msg: map[string]any{"name": "ada"}})
	if err != nil || text != "Hello, ADA!" {
		t.Errorf("text = %q, %v", text, err)
	}
	if plan.Sinks[0].Input != plan.Stage("greet").Output {
		t.Error("the sink does not read the stage's implicit output")
	}
}

// TestKindExamples checks that the example of every kind, shown in the reference docs, is a block that
// decodes without errors.
func TestKindExamples(t *testing.T) {
	for _, spec := range Language {
		for _, k := range spec.Kinds {
			if k.Example == "" {
				t.Errorf("%s kind %s has no example", spec.Type, k.Name)
				continue
			}
			f, diags := hclsyntax.ParseConfig([]byte(k.Example), k.Name+".hcl", hcl.InitialPos)
			if diags.HasErrors() {
				t.Errorf("%s kind %s: example does not parse: %s", spec.Type, k.Name, diags)
				continue
			}
			content, diags := f.Body.Content(TopLevelSchema)
			if diags.HasErrors() || len(content.Blocks) != 1 {
				t.Errorf("%s kind %s: example is not one block: %s", spec.Type, k.Name, diags)
				continue
			}
			b, diags := DecodeBlock(content.Blocks[0], spec)
			if diags.HasErrors() || b.Kind != k {
				t.Errorf("%s kind %s: example does not decode: %s", spec.Type, k.Name, diags)
			}
			if out, _ := Format("x.hcl", []byte(k.Example+"\n")); string(out) != k.Example+"\n" {
				t.Errorf("%s kind %s: example is not formatted:\n%s", spec.Type, k.Name, out)
			}
		}
	}
}

func TestEnvFunction(t *testing.T) {
	p := compileSource(t, `
pipeline "e" {
  key_prefix = env("PREFIX", "fallback")
}
topic "t" {}
source "s" {
  kind   = "stdin"
  output = topic.t
}
sink "o" {
  kind  = "file"
  input = topic.t
  path  = env("OUT_PATH", "out.jsonl")
}
`, Options{LookupEnv: func(k string) (string, bool) {
		if k == "PREFIX" {
			return "from-env", true
		}
		return "", false
	}})
	if p.KeyPrefix != "from-env" || p.Sinks[0].Config.String("path") != "out.jsonl" {
		t.Fatalf("key prefix %q, path %q", p.KeyPrefix, p.Sinks[0].Config.String("path"))
	}
}

func TestFileFunctionAndPaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prefix.txt"), []byte("from-file"), 0o644); err != nil {
		t.Fatal(err)
	}
	pipeline := `
pipeline "f" {
  key_prefix = trimspace(file("${path.pipeline}/prefix.txt"))
}
topic "t" {}
source "s" {
  kind   = "file"
  path   = "${path.pipeline}/in.jsonl"
  output = topic.t
}
sink "o" {
  kind  = "stdout"
  input = topic.t
}
`
	if err := os.WriteFile(filepath.Join(dir, "p.hcl"), []byte(pipeline), 0o644); err != nil {
		t.Fatal(err)
	}
	p, _, diags := Build(dir, Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if p.KeyPrefix != "from-file" {
		t.Errorf("key prefix = %q", p.KeyPrefix)
	}
	if got := p.Sources[0].Config.String("path"); got != filepath.Join(dir, "in.jsonl") {
		t.Errorf("path = %q, want it next to the pipeline", got)
	}
}

func TestPipelineFileErrors(t *testing.T) {
	dir := t.TempDir()
	for path, want := range map[string]string{
		filepath.Join(dir, "missing"): "Pipeline not found",
		dir:                           "No pipeline files",
	} {
		_, _, diags := Build(path, Options{})
		if !strings.Contains(diags.Error(), want) {
			t.Errorf("Build(%s) = %s, want %q", path, diags.Error(), want)
		}
	}
	txt := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(txt, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, diags := Build(txt, Options{}); !strings.Contains(diags.Error(), "Not a pipeline file") {
		t.Errorf("Build(%s) = %s", txt, diags.Error())
	}
}

// TestETLExampleExpressions evaluates the ETL example's expressions on a line of its sample data.
func TestETLExampleExpressions(t *testing.T) {
	plan, _, diags := Build(filepath.Join(examplesDir, "etl"), Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	msg := map[string]any{
		"id": 5006.0, "status": "completed", "internal_note": "checked",
		"customer": map[string]any{"id": "cust-6", "email": "  GRACE@EXAMPLE.COM ", "country": nil},
		"items": []any{
			map[string]any{"sku": "SKU-100", "price": 9.5, "qty": 2.0},
			map[string]any{"sku": "SKU-400", "price": 120.0, "qty": 1.0},
		},
	}
	keep, err := plan.Stage("completed").Config.Expr("where").EvalBool(&expr.Env{Msg: msg})
	if err != nil || !keep {
		t.Fatalf("where = %v, %v", keep, err)
	}
	want := map[string]any{
		"order_id": "5006", "customer_id": "cust-6", "email": "grace@example.com", "country": "UNKNOWN",
		"items": 2.0, "total": 139.0, "skus": "SKU-100,SKU-400",
	}
	for _, f := range plan.Stage("normalise").Config.Fields("set") {
		v, err := f.Expr.Eval(&expr.Env{Msg: msg})
		if err != nil {
			t.Errorf("%s: %v", f.Name, err)
			continue
		}
		if got := v.Interface(); got != want[f.Name] {
			t.Errorf("%s = %#v, want %#v", f.Name, got, want[f.Name])
		}
	}
}

func TestOptionsValuesWinAndAreChecked(t *testing.T) {
	plan := compileSource(t, varsPipeline, Options{
		Vars:   []string{"n=2", "name=flag"},
		Values: map[string]cty.Value{"n": cty.StringVal("3")}, // converts to number, as --var does
	})
	if plan.Topics[0].Partitions != 3 {
		t.Errorf("partitions = %d, want the value's 3 over --var's 2", plan.Topics[0].Partitions)
	}
	if plan.Variables[1].Name != "name" || plan.Variables[1].Value.AsString() != "flag" {
		t.Errorf("variables = %+v", plan.Variables)
	}
	rng := hcl.Range{Filename: "x.flowtest.hcl", Start: hcl.Pos{Line: 2, Column: 3, Byte: 10}, End: hcl.Pos{Line: 2, Column: 5, Byte: 12}}
	_, diags := compileDiags(t, varsPipeline, Options{
		Values:      map[string]cty.Value{"n": cty.StringVal("many"), "nn": cty.NumberIntVal(1)},
		ValueRanges: map[string]hcl.Range{"n": rng, "nn": rng},
	})
	var texts []string
	for _, d := range diags {
		if d.Subject == nil || *d.Subject != rng {
			t.Errorf("diagnostic not at the value: %s: %s at %v", d.Summary, d.Detail, d.Subject)
		}
		texts = append(texts, d.Summary+": "+d.Detail)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{`does not suit variable "n"`, `A value is given for "nn", but the pipeline declares no such variable. Did you mean "n"?`} {
		if !strings.Contains(all, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, all)
		}
	}
}
