// Package stages holds flowrun's stage functions: the public registry through which Go code adds
// stage functions to a flowrun binary ("Go plugins"), and the built-in kinds.
//
// A team's package registers its functions in init:
//
//	func init() {
//		stages.Register("acme.score", func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
//			m.Value["score"] = score(m.Value)
//			return []stages.Message{m}, nil
//		})
//	}
//
// and a custom binary blank-imports that package and calls cmd.Main (see examples/plugins). A
// pipeline then uses the function with kind = "go" and func = "acme.score".
//
// This package does not load code at run time: Go's plugin package is deliberately not used, as
// version skew between host and plugin breaks loading, it needs cgo, and plugins cannot be unloaded.
// It never speaks to Redis either; the runtime feeds functions messages and writes what they return.
package stages
