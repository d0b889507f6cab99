// Package expr compiles the per-message expressions of a pipeline (where,
// key, set, generator templates) into Go closures over decoded JSON values.
//
// An expression is compiled once from its HCL syntax tree (native syntax or
// JSON syntax) and then evaluated for every message without going through
// cty: a comparison such as `msg.amount > 100 && msg.country == "DE"` takes
// well under a microsecond and allocates nothing, where cty evaluation of
// the same expression costs several microseconds.
//
// What it does:
//
//   - Every sub-expression that depends on nothing per-message (literals,
//     var.*, local.*, pure function calls on those) is folded at compile
//     time through cty, so its value and its type errors are exactly HCL's.
//   - The rest follows HCL's semantics: operand conversions ("5" + 1 is 6,
//     == never converts), number formatting, deep equality, null handling,
//     conditional result unification, && and || (see logical in ops.go for
//     how HCL's evaluate-both-sides rule maps onto short-circuiting), for
//     and splat expressions, templates with %{if} and %{for}, try and can.
//   - Common functions have native implementations. Any other function of
//     Scope.Functions is called through cty for that call only, and Compile
//     warns about it. A native implementation that meets an unusual
//     argument hands that one call to cty too, so results stay cty's.
//   - Compile reports unknown variables, undeclared var.*/local.*, unknown
//     functions (all with "did you mean"), wrong argument counts and type
//     errors it can see statically, all at once, as hcl.Diagnostics.
//   - Evaluation failures are *EvalError values carrying the range of the
//     failing sub-expression. Evaluation never panics and does not use
//     recover; fuzz tests check that.
//
// What it deliberately does not do:
//
//   - Arbitrary precision. Arithmetic is float64 where cty uses big.Float
//     (512 bits for literals). Integers are exact up to 2^53 and results
//     agree with cty whenever both are exact; otherwise they can differ in
//     the last digits (0.1 + 0.2 prints as 0.30000000000000004). Numbers
//     that float64 cannot hold (a 20-digit id) keep their exact digits when
//     passed through or converted to strings, but compare and compute as
//     float64.
//   - Typed collections. Values are plain JSON: cty's lists, sets and
//     tuples are all lists, maps and objects are all objects. So
//     tolist(["a"]) == ["a"] is true here, while cty compares the types.
//   - Unknown values. A config value that is unknown at compile time makes
//     the expressions using it fail at evaluation instead.
//   - Normalizing strings. cty NFC-normalizes every string; here strings
//     pass through unchanged, but == compares them normalized, like cty.
//   - Infinity: like cty, 1/0 is +Inf (0/0 is an error); unlike a cty
//     value, an infinite number cannot be encoded as JSON by the caller.
package expr
