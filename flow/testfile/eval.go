package testfile

import (
	"os"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/flowrun/flowrun/flow"
)

// Eval evaluates the condition with scope's variables (output, dead_letters and metrics, as
// Assert describes them) and the functions of pipelines. A result that is not a known bool is
// an error located at the condition, as is any evaluation error.
func (a *Assert) Eval(scope map[string]cty.Value) (bool, hcl.Diagnostics) {
	ctx := &hcl.EvalContext{Variables: scope, Functions: flow.Functions(os.LookupEnv)}
	v, diags := a.Condition.Value(ctx)
	if diags.HasErrors() {
		return false, diags
	}
	v, _ = v.Unmark()
	if v.IsNull() || !v.IsKnown() || v.Type() != cty.Bool {
		what := "null"
		switch {
		case !v.IsKnown():
			what = "not known"
		case !v.IsNull():
			what = "a " + v.Type().FriendlyName()
		}
		return false, diags.Append(&hcl.Diagnostic{
			Severity:    hcl.DiagError,
			Summary:     "Invalid condition",
			Detail:      "An assert's condition must be true or false; this one is " + what + ".",
			Subject:     a.Condition.Range().Ptr(),
			Expression:  a.Condition,
			EvalContext: ctx,
		})
	}
	return v.True(), diags
}
