package flow_test

import (
	. "github.com/flowrun/flowrun/flow"
	_ "github.com/flowrun/flowrun/stages"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	good := map[string]Size{
		"0B":      0,
		"512B":    512,
		"64KiB":   64 << 10,
		"64MiB":   64 << 20,
		"64 MiB":  64 << 20,
		"1.5MiB":  3 << 19,
		"2GiB":    2 << 30,
		"1KB":     1000,
		"20MB":    20_000_000,
		"1GB":     1_000_000_000,
		"0.5KiB":  512,
		"1024KiB": 1 << 20,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":               "empty",
		"64":             `has no unit; write "64B", "64KiB" or "64MiB"`,
		"-1MiB":          "negative",
		"64mib":          `unknown unit "mib"`,
		"64mb":           `Did you mean "64MB"?`,
		"64K":            `Did you mean "64KB"?`,
		"64 bytes":       `unknown unit "bytes"`,
		"MiB":            "write a number and a unit",
		"1..5MiB":        "not a number",
		"0.3B":           "not a whole number of bytes",
		"1e30GiB":        "not a size", // no exponents: the number stops at the e
		"99999999999GiB": "too large",
	}
	for in, want := range bad {
		_, err := ParseSize(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSize(%q) error = %v; want one containing %q", in, err, want)
		}
	}
}

func TestFormatSizeRoundTrips(t *testing.T) {
	for size, want := range map[Size]string{0: "0B", 1: "1B", 1000: "1KB", 1024: "1KiB", 1500: "1500B", 64 << 20: "64MiB", 3 << 19: "1536KiB", 2_000_000: "2MB", 1 << 30: "1GiB"} {
		s := FormatSize(size)
		back, err := ParseSize(s)
		if s != want || err != nil || back != size {
			t.Errorf("FormatSize(%d) = %q (want %q), which parses as %d, %v", size, s, want, back, err)
		}
	}
}

// TestMaxMessageSize: the pipeline's max_message_size reaches the plan in bytes, and a pipeline
// that does not set it gets the default.
func TestMaxMessageSize(t *testing.T) {
	for src, want := range map[string]int64{
		`pipeline "p" {}`: int64(DefaultMaxMessageSize),
		`pipeline "p" {
  max_message_size = "1MiB"
}`: 1 << 20,
	} {
		cfg, diags := LoadSource(map[string][]byte{"p.hcl": []byte(src + "\n" + `
topic "t" {}
source "s" {
  kind   = "stdin"
  output = topic.t
}
sink "o" {
  kind  = "stdout"
  input = topic.t
}`)})
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		plan, diags := Compile(cfg, testOptions)
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		if plan.MaxMessageSize != want {
			t.Errorf("MaxMessageSize = %d, want %d, of\n%s", plan.MaxMessageSize, want, src)
		}
	}
	if DefaultMaxMessageSize != 64<<20 {
		t.Errorf("the default is %s, want 64MiB", FormatSize(DefaultMaxMessageSize))
	}
}

// TestOffloadOver: the pipeline's offload_over reaches the plan in bytes, "off" and "0B" turn it
// off, the default is 64KiB, and a value that is neither a size nor "off" is an error at its line
// that says both.
func TestOffloadOver(t *testing.T) {
	const rest = `
topic "t" {}
source "s" {
  kind   = "stdin"
  output = topic.t
}
sink "o" {
  kind  = "stdout"
  input = topic.t
}`
	for setting, want := range map[string]int64{
		``:                        int64(DefaultOffloadOver),
		`offload_over = "1MiB"`:   1 << 20,
		`offload_over = "off"`:    0,
		`offload_over = "0B"`:     0,
		`offload_over = "100KiB"`: 100 << 10,
	} {
		cfg, diags := LoadSource(map[string][]byte{"p.hcl": []byte("pipeline \"p\" {\n  " + setting + "\n}\n" + rest)})
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		plan, diags := Compile(cfg, testOptions)
		if diags.HasErrors() {
			t.Fatal(setting, diags)
		}
		if plan.OffloadOver != want {
			t.Errorf("%s: OffloadOver = %d, want %d", setting, plan.OffloadOver, want)
		}
	}
	cfg, diags := LoadSource(map[string][]byte{"p.hcl": []byte("pipeline \"p\" {\n  offload_over = \"never\"\n}\n" + rest)})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	_, diags = Compile(cfg, testOptions)
	if !diags.HasErrors() || diags[0].Subject == nil || diags[0].Subject.Start.Line != 2 ||
		!strings.Contains(diags[0].Detail, `"off"`) || !strings.Contains(diags[0].Detail, "offload_over") {
		t.Errorf("offload_over = \"never\": %v; want an error at line 2 naming offload_over and \"off\"", diags)
	}
	if DefaultOffloadOver != 64<<10 {
		t.Errorf("the default is %s, want 64KiB", FormatSize(DefaultOffloadOver))
	}
}
