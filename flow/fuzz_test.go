package flow_test

import (
	. "github.com/flowrun/flowrun/flow"
	_ "github.com/flowrun/flowrun/stages"
	"testing"
)

// FuzzLoad feeds arbitrary bytes through the whole front end, parsing as native or JSON syntax and
// compiling, which must report problems as diagnostics and never panic. The seed corpus in
// testdata/fuzz/FuzzLoad holds the examples and the diagnostic fixtures.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`pipeline "p" {}`), false)
	f.Add([]byte(`{"pipeline": {"p": {}}}`), true)
	f.Fuzz(func(t *testing.T, src []byte, asJSON bool) {
		name := "fuzz.hcl"
		if asJSON {
			name = "fuzz.hcl.json"
		}
		cfg, diags := LoadSource(map[string][]byte{name: src})
		if cfg.SyntaxErrors() {
			return
		}
		plan, more := Compile(cfg, Options{
			GoFuncs:   []string{"acme.score"},
			LookupEnv: func(string) (string, bool) { return "", false },
		})
		diags = append(diags, more...)
		if plan == nil && !diags.HasErrors() {
			t.Fatal("no plan and no error")
		}
		for _, d := range diags {
			if d.Severity == 0 || d.Summary == "" {
				t.Fatalf("malformed diagnostic %#v", d)
			}
		}
		if plan != nil {
			for _, format := range GraphFormats {
				if err := WriteGraph(discard{}, plan, format); err != nil {
					t.Fatalf("graph %s: %v", format, err)
				}
			}
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
