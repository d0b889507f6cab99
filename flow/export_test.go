package flow

// Unexported parts of the package that its external tests (package flow_test, which can import the
// kinds of package stages) use.
var (
	TopLevelSchema = topLevelSchema
	DecodeBlock    = decodeBlock
	IsPipelineFile = isPipelineFile
	JSONExt        = jsonExt
	NativeExt      = nativeExt
)

// SyntaxErrors reports whether the files had syntax errors.
func (c *Config) SyntaxErrors() bool { return c.syntaxErrors }
