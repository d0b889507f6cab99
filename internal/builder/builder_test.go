package builder

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseWith(t *testing.T) {
	for spec, want := range map[string]Package{
		"example.com/acme":            {Path: "example.com/acme"},
		"example.com/acme@v1.2.0":     {Path: "example.com/acme", Version: "v1.2.0"},
		"example.com/acme/kinds=../a": {Path: "example.com/acme/kinds", Dir: "../a"},
		"example.com/acme=../a@b":     {Path: "example.com/acme", Dir: "../a@b"}, // a path may hold '@'
	} {
		if got, err := ParseWith(spec); err != nil || got != want {
			t.Errorf("ParseWith(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
	}
	for _, spec := range []string{"", "example.com/acme=", "example.com/acme@", "a b", "=../a"} {
		if p, err := ParseWith(spec); err == nil {
			t.Errorf("ParseWith(%q) = %+v, want an error", spec, p)
		}
	}
}

// The main module requires flowrun at the version given, replaces each local module (once, for
// two packages of it) and imports each package once.
func TestWriteModule(t *testing.T) {
	acme := t.TempDir()
	if err := os.WriteFile(filepath.Join(acme, "go.mod"), []byte("module example.com/acme\n\ngo 1.25.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(acme, "go.sum"), []byte("example.com/dep v1.0.0 h1:x=\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	err := writeModule(work, Options{
		Flowrun: Flowrun{Version: "v1.2.3"},
		Packages: []Package{
			{Path: "example.com/acme", Dir: acme}, {Path: "example.com/acme/kinds", Dir: acme},
			{Path: "github.com/team/flowkinds", Version: "v1.4.0"}, {Path: "example.com/acme", Dir: acme},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(work, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	mod := read("go.mod")
	for _, want := range []string{"github.com/flowrun/flowrun v1.2.3", "example.com/acme " + localVersion, "replace example.com/acme => " + acme} {
		if !strings.Contains(mod, want) {
			t.Errorf("go.mod has no %q:\n%s", want, mod)
		}
	}
	if strings.Count(mod, "replace") != 1 || strings.Contains(mod, "flowkinds") {
		t.Errorf("go.mod: one replace, and the versioned module left to go get:\n%s", mod)
	}
	if sum := read("go.sum"); sum != "example.com/dep v1.0.0 h1:x=\n" {
		t.Errorf("go.sum %q, want acme's", sum)
	}
	main := read("main.go")
	for _, imp := range []string{`_ "example.com/acme"`, `_ "example.com/acme/kinds"`, `_ "github.com/team/flowkinds"`} {
		if strings.Count(main, imp) != 1 {
			t.Errorf("main.go imports %s %d times:\n%s", imp, strings.Count(main, imp), main)
		}
	}
}
